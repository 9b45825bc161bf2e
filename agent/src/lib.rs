//! railguard-agent: the per-node agent. It discovers the GPU×NIC topology, runs verified
//! transfers and collects passive signals; everything it produces goes through the [`spool`]
//! to the collector via the [`shipper`], so nothing is lost across crashes and outages. The
//! running agent is [`service`]; the command line (src/cli) only parses and calls it.

pub mod inline;
pub mod metrics;
pub mod probe;
mod said_once;
pub mod service;
pub mod shipper;
pub mod signals;
pub mod spool;
pub mod stop;
pub mod topology;

/// The text of a caught panic (`catch_unwind`'s payload), for an error message.
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| (*s).to_owned()))
        .unwrap_or_default()
}

pub use railguard_telemetry::hostname;
