//! Events from a library a non-root user could have written (marked `untrusted` by the agent)
//! are kept and shown, and never raise a GPU's status; the same events unmarked do.
#![allow(clippy::unwrap_used)] // test code: failures should panic loudly

use std::time::Duration;

use chrono::Utc;
use railguard_agent::topology::fixture;
use railguard_e2e::scripted::*;
use railguard_e2e::*;
use railguard_schema::*;

fn ucx_error(nic: &str, i: u32, untrusted: bool) -> wire::Record {
    let mut attrs: std::collections::BTreeMap<String, String> =
        [("syndrome_name".to_owned(), "local protection error".to_owned()), ("pid".to_owned(), i.to_string())].into();
    let mut summary = format!("UCX error CQE in pid {i}: requester local protection error #{i}");
    if untrusted {
        attrs.insert("untrusted".into(), "owned by uid 65534".into());
        summary = format!("[untrusted: library owned by uid 65534] {summary}");
    }
    let s = SignalEvent {
        source: SignalSource::EbpfUprobe,
        kind: SignalKind::UcxErrorCqe,
        bdf: None,
        gpu: None,
        nic: nic.into(),
        summary,
        attrs,
    };
    Record {
        id: RecordId::random(),
        observed_at: Utc::now() - chrono::Duration::seconds(5),
        body: RecordBody::Signal(s),
    }
    .into()
}

#[tokio::test(flavor = "multi_thread")]
async fn untrusted_uprobe_events_are_shown_but_never_raise_a_status() {
    let pg = TestPg::start().await;
    let c = CollectorProc::start_with(&pg.url(), &["healthy"], &[]);
    let mut recs = vec![topo_rec(topology(&fixture::dgx_h100_like(), None))];
    for g in 0..8u32 {
        recs.push(probe_rec(g, &format!("mlx5_{g}"), ProbeVerdict::Ok, PairSelection::Predicted, 30));
    }
    for i in 0..5 {
        recs.push(ucx_error("mlx5_3", i, true));
        recs.push(ucx_error("mlx5_5", 100 + i, false));
    }
    send(&c, "healthy", recs).await;
    wait::until("the node's 8 GPUs assessed", Duration::from_secs(60), || {
        let st = statuses(&c, "healthy");
        if st.len() == 8 { Ok(()) } else { Err(format!("{st:?}")) }
    });
    // A pass begun after every record was stored and assessed: the statuses are settled.
    c.wait_for_a_later_pass();
    let st = statuses(&c, "healthy");
    assert_eq!(st[5], "at_risk", "trusted UCX errors on GPU5's NIC raise it: {st:?}");
    assert_eq!(st[3], st[0], "untrusted events left GPU3 as its healthy peers: {st:?}");
    // Kept and shown: GPU3's view lists the events on its workload NIC, marked; GPU5's, unmarked.
    let gpu3 = json(&c, "/api/v1/nodes/healthy/gpus/3");
    let shown = gpu3["signals_last_day"].as_array().unwrap();
    assert_eq!(shown.len(), 5, "{gpu3}");
    assert!(shown.iter().all(|s| s["attrs"]["untrusted"] == "owned by uid 65534"), "{gpu3}");
    assert!(shown[0]["summary"].as_str().unwrap().starts_with("[untrusted: library owned by uid 65534]"));
    let gpu5 = json(&c, "/api/v1/nodes/healthy/gpus/5");
    assert_eq!(gpu5["signals_last_day"].as_array().unwrap().len(), 5, "{gpu5}");
    assert!(gpu5["signals_last_day"][0]["attrs"].get("untrusted").is_none());
}
