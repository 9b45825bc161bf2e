//! The collector's fleet-wide background work, each done by one replica at a time when several
//! share one Postgres: [`leader`] decides which (a session-level advisory lock per task),
//! [`retention`] rolls up passed hours and drops expired partitions, [`k8s_nodes`] keeps the
//! Kubernetes node conditions (and, opt-in, taints and cordons) in step with the GPU verdicts,
//! [`k8s_devices`] the opt-in per-device taints (their breaker's share counted over the GPUs
//! the cluster knows, [`k8s_gpus`]); both share [`k8s_controller`].
//! [`assessment`] runs the assessment's passes: each replica's periodic ones over its
//! [`share`] of the fleet's parts, and failing nodes' at once on every replica. [`k8s_jwks`] keeps the cluster's service-account key set fetched,
//! on every replica.

pub mod assessment;
pub mod k8s_controller;
pub mod k8s_devices;
pub mod k8s_gpus;
pub mod k8s_jwks;
pub mod k8s_nodes;
pub mod leader;
pub mod retention;
pub mod share;
