//! Collectors that scale out: two collectors on one Postgres; exactly one leads the
//! fleet-wide work (the full assessment, retention); the leader is SIGKILLed while an agent
//! ships to the other, which takes over: every record stored once, the assessment goes on, no
//! status change recorded twice.
#![allow(clippy::unwrap_used)] // test code: failures should panic loudly

use std::time::{Duration, Instant};

use railguard_e2e::*;

fn leads(c: &CollectorProc, task: &str) -> Option<bool> {
    let (code, m) = c.get("/metrics", None);
    if code != 200 {
        return None;
    }
    m.lines().find(|l| l.starts_with(&format!("railguard_leader{{task=\"{task}\"}}"))).map(|l| l.ends_with(" 1"))
}

fn assessment_age(c: &CollectorProc) -> Option<f64> {
    let (_, m) = c.get("/metrics", None);
    m.lines().find_map(|l| l.strip_prefix("railguard_assessment_age_seconds ")).and_then(|v| v.parse().ok())
}

#[tokio::test(flavor = "multi_thread")]
async fn the_leader_is_killed_under_load_and_the_other_collector_takes_over() {
    let pg = TestPg::start().await;
    let mut a = CollectorProc::start(&pg.url());
    // The first collector takes both locks once its tasks run; only then does the second start
    // (started at once, the two would race for them).
    wait::until_true("the only collector to lead both tasks", Duration::from_secs(60), || {
        leads(&a, "assessment") == Some(true) && leads(&a, "retention") == Some(true)
    });
    let b = CollectorProc::start(&pg.url());
    // Exactly one leads each task.
    wait::until("leadership to settle", Duration::from_secs(60), || {
        let (la, lb) = (leads(&a, "assessment"), leads(&b, "assessment"));
        let (ra, rb) = (leads(&a, "retention"), leads(&b, "retention"));
        if la.is_some() && lb.is_some() && la != lb && ra != rb && ra.is_some() && rb.is_some() {
            assert_eq!((la, ra), (Some(true), Some(true)), "the first collector to start holds both tasks");
            Ok(())
        } else {
            Err(format!("{la:?} {lb:?} {ra:?} {rb:?}"))
        }
    });
    let (leader, follower) = (&mut a, b);

    // Load: an agent ships 5,000 records (failures among them) to the follower.
    let dir = tempfile::tempdir().unwrap();
    let (spool, token) = filled_spool(dir.path(), 5_000);
    let mut agent = KillOnDrop(agent_ship(&follower.url(), &spool, &token, 50));
    // Under load: the leader dies once batches are flowing.
    wait::until_async("the agent's first batches stored", Duration::from_secs(60), async || {
        let (stored, _) = pg.stored_and_distinct().await;
        if stored > 0 { Ok(()) } else { Err(stored) }
    })
    .await;
    leader.kill(); // SIGKILL: no goodbye, its connections just die
    let t0 = Instant::now();
    let mut assessment_at = None;
    wait::until_true("the surviving collector to take over both tasks", Duration::from_secs(60), || {
        if assessment_at.is_none() && leads(&follower, "assessment") == Some(true) {
            assessment_at = Some(t0.elapsed());
        }
        leads(&follower, "assessment") == Some(true) && leads(&follower, "retention") == Some(true)
    });
    eprintln!(
        "took over the assessment {:?} and retention {:?} after the leader was killed",
        assessment_at.unwrap_or(t0.elapsed()),
        t0.elapsed()
    );
    assert!(wait_exit(&mut agent.0, Duration::from_secs(120)).success());
    let (stored, distinct) = pg.stored_and_distinct().await;
    assert_eq!((stored, distinct), (5_000, 5_000), "every record stored once");
    // The assessment goes on under the new leader.
    wait::until("a fresh assessment after the takeover", Duration::from_secs(40), || {
        let age = assessment_age(&follower);
        if age.is_some_and(|a| a < 3.0) { Ok(()) } else { Err(format!("age {age:?}")) }
    });
    let holder: String = sqlx::query_scalar("SELECT holder FROM assessment_runs").fetch_one(&pg.pool).await.unwrap();
    assert!(holder.ends_with(&format!(":{}", follower.pid().unwrap())), "{holder}");
    // No status change recorded twice (the assessments write under one lock).
    let twice: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM (SELECT to_status, lag(to_status) OVER (PARTITION BY node_id, gpu_index ORDER BY id) AS prev
                               FROM gpu_status_changes) x WHERE prev = to_status",
    )
    .fetch_one(&pg.pool)
    .await
    .unwrap();
    assert_eq!(twice, 0);
    let gpus: i64 = sqlx::query_scalar("SELECT count(*) FROM gpu_status WHERE node_id = 'node-a'")
        .fetch_one(&pg.pool)
        .await
        .unwrap();
    assert!(gpus > 0, "node-a's GPUs are assessed");
}
