//! What both Kubernetes controllers share: the taint railguard's actions carry and the counts
//! /metrics shows. [`super::k8s_nodes`] acts on Nodes and [`super::k8s_devices`] on
//! DeviceTaintRules; each leans on this module and the node controller drives the device one,
//! never the other way round.

/// The key of the taint on a node ([`super::k8s_nodes`]) or a device
/// ([`super::k8s_devices`]) with a `corrupting` GPU.
pub const TAINT_KEY: &str = "railguard.io/kv-transfer-corrupting";

/// The controllers' counts for /metrics.
#[derive(Debug, Default)]
pub struct ControllerStats {
    /// Rounds of the loop: leadership checked, and acted on when held.
    pub rounds: std::sync::atomic::AtomicU64,
    pub patches: std::sync::atomic::AtomicU64,
    pub errors: std::sync::atomic::AtomicU64,
    pub breaker_open: std::sync::atomic::AtomicBool,
    /// DeviceTaintRules created or deleted ([`super::k8s_devices`]).
    pub device_rule_changes: std::sync::atomic::AtomicU64,
    /// Failed DeviceTaintRule requests (lists, creations, deletions).
    pub device_errors: std::sync::atomic::AtomicU64,
    /// 1 while the device-taint breaker refuses new rules.
    pub device_breaker_open: std::sync::atomic::AtomicBool,
}
