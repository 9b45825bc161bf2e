//! railguard-telemetry: what both binaries share about running as a service — logs to stderr
//! always, traces and metrics over OTLP (gRPC) when `OTEL_EXPORTER_OTLP_ENDPOINT` is set, and
//! the shutdown signal, how a secret file is read ([`secret`]), and how connection slots are
//! shared among peers ([`slots`]).

pub mod secret;
pub mod slots;

use opentelemetry::KeyValue;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::metrics::SdkMeterProvider;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::Layer;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// Flushes and stops OTLP export when dropped (call [`Telemetry::shutdown`] to wait for it).
#[derive(Debug, Default)]
pub struct Telemetry {
    tracer: Option<SdkTracerProvider>,
    meter: Option<SdkMeterProvider>,
}

impl Telemetry {
    /// Whether OTLP export is on.
    pub fn exporting(&self) -> bool {
        self.tracer.is_some()
    }

    /// Flushes what is buffered and stops the exporters.
    pub fn shutdown(&mut self) {
        if let Some(t) = self.tracer.take()
            && let Err(e) = t.shutdown()
        {
            eprintln!("OTLP trace export shutdown: {e}");
        }
        if let Some(m) = self.meter.take()
            && let Err(e) = m.shutdown()
        {
            eprintln!("OTLP metric export shutdown: {e}");
        }
    }
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Sets up logging (RUST_LOG, default `default_filter`) and, with OTEL_EXPORTER_OTLP_ENDPOINT,
/// OTLP traces (every tracing span) and metrics (the global meter). Call inside a Tokio runtime.
pub fn init(service: &'static str, default_filter: &str) -> Telemetry {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| default_filter.into());
    let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let endpoint = std::env::var("OTEL_EXPORTER_OTLP_ENDPOINT").ok().filter(|e| !e.is_empty());
    // RUST_LOG filters what is logged; what is traced over OTLP is decided separately.
    let fmt = fmt.with_filter(filter);
    let Some(endpoint) = endpoint else {
        tracing_subscriber::registry().with(fmt).init();
        return Telemetry::default();
    };
    let resource = Resource::builder()
        .with_service_name(service)
        .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
        .build();
    let spans = opentelemetry_otlp::SpanExporter::builder().with_tonic().build();
    let metrics = opentelemetry_otlp::MetricExporter::builder().with_tonic().build();
    match (spans, metrics) {
        (Ok(spans), Ok(metrics)) => {
            let tracer =
                SdkTracerProvider::builder().with_batch_exporter(spans).with_resource(resource.clone()).build();
            let meter = SdkMeterProvider::builder().with_periodic_exporter(metrics).with_resource(resource).build();
            opentelemetry::global::set_meter_provider(meter.clone());
            let otel = tracing_opentelemetry::layer().with_tracer(tracer.tracer(service)).with_filter(
                tracing_subscriber::EnvFilter::new("info,h2=warn,hyper=warn,tower=warn,tonic=warn,sqlx=warn"),
            );
            tracing_subscriber::registry().with(fmt).with(otel).init();
            tracing::info!(%endpoint, "exporting traces and metrics over OTLP");
            Telemetry { tracer: Some(tracer), meter: Some(meter) }
        }
        (Err(e), _) | (_, Err(e)) => {
            tracing_subscriber::registry().with(fmt).init();
            tracing::warn!(%endpoint, error = %e, "OTLP export disabled: exporter could not be built");
            Telemetry::default()
        }
    }
}

/// Resolves on SIGINT (Ctrl-C) or SIGTERM (what systemd and Kubernetes send).
pub async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot listen for SIGTERM; only Ctrl-C stops this process");
            let _ = tokio::signal::ctrl_c().await;
        }
    }
    tracing::info!("shutting down");
}

/// This machine's host name (`/proc/sys/kernel/hostname`), or "unknown".
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_owned())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown".to_owned())
}
