//! Collectors that scale out: two collectors on one Postgres; exactly one leads the
//! fleet-wide work (the assessment's bookkeeping, retention); the leader is SIGKILLed while an
//! agent ships to the other, which takes over: every record stored once, the assessment goes on,
//! no status change recorded twice. Three collectors split the assessment's parts a third each;
//! one SIGKILLed, the two left take its parts and assess every part's nodes.
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

fn gauge(c: &CollectorProc, name: &str) -> Option<usize> {
    let (code, m) = c.get("/metrics", None);
    if code != 200 {
        return None;
    }
    m.lines().find_map(|l| l.strip_prefix(&format!("{name} "))).and_then(|v| v.parse().ok())
}

/// Which backend holds each part's lock now.
async fn part_holders(pg: &TestPg) -> Vec<(i64, i32)> {
    sqlx::query_as(
        "SELECT objid::int8, pid FROM pg_locks
         WHERE locktype = 'advisory' AND objsubid = 2 AND granted AND classid::int8 = $1 ORDER BY 1",
    )
    .bind(i64::from(railguard_collector::store::locks::ASSESSMENT_PART))
    .fetch_all(&pg.pool)
    .await
    .unwrap()
}

/// Three collectors on one Postgres split the assessment: each holds about a third of the 64
/// parts, no part twice; one is SIGKILLed and the two others take its parts within seconds and
/// assess the nodes of them that bring evidence after it died.
#[tokio::test(flavor = "multi_thread")]
async fn three_collectors_split_the_assessment_and_the_survivors_take_over_a_killed_ones_parts() {
    use railguard_agent::topology::fixture;
    use railguard_schema::{NodeId, Record};
    let pg = TestPg::start().await;
    let mut cs =
        vec![CollectorProc::start(&pg.url()), CollectorProc::start(&pg.url()), CollectorProc::start(&pg.url())];
    let settled = |cs: &[CollectorProc], members: usize| -> Result<Vec<usize>, String> {
        let held: Vec<Option<usize>> = cs.iter().map(|c| gauge(c, "railguard_assessment_parts_held")).collect();
        let seen: Vec<Option<usize>> = cs.iter().map(|c| gauge(c, "railguard_assessment_members")).collect();
        let held: Option<Vec<usize>> = held.into_iter().collect();
        match held {
            // Settled once every part is held and none by a collector over its share: the first
            // to start holds all 64 until it sees the others and gives theirs up.
            Some(h)
                if h.iter().sum::<usize>() == 64
                    && h.iter().all(|s| *s <= 64usize.div_ceil(members))
                    && seen.iter().all(|s| *s == Some(members)) =>
            {
                Ok(h)
            }
            h => Err(format!("parts held {h:?}, members seen {seen:?}")),
        }
    };
    let shares = wait::until("three collectors to split the parts", Duration::from_secs(60), || settled(&cs, 3));
    assert!(shares.iter().all(|s| (21..=22).contains(s)), "a third each: {shares:?}");
    let holders = part_holders(&pg).await;
    assert_eq!(holders.len(), 64, "every part held once: {holders:?}");
    let backends: std::collections::BTreeSet<i32> = holders.iter().map(|(_, pid)| *pid).collect();
    assert_eq!(backends.len(), 3, "by three sessions: {holders:?}");
    let leaders = cs.iter().filter(|c| leads(c, "assessment") == Some(true)).count();
    assert_eq!(leaders, 1, "one collector exports the fleet's series");

    // The last of them dies: no goodbye, its connections just die.
    let mut victim = cs.pop().unwrap();
    victim.kill();
    let t0 = Instant::now();
    let killed_at = chrono::Utc::now();
    let shares = wait::until("the two left to hold every part", Duration::from_secs(60), || settled(&cs, 2));
    let took = t0.elapsed();
    eprintln!("the survivors held all 64 parts {took:?} after the kill: {shares:?}");
    assert!(shares.iter().all(|s| *s == 32), "half each: {shares:?}");
    assert_eq!(part_holders(&pg).await.len(), 64);

    // A node of every part brings evidence after the kill: the survivors assess all of them.
    // One name per part, chosen by Postgres's own hash of the names.
    let store = railguard_collector::store::Store::new(pg.pool.clone());
    let candidates: Vec<String> = (0..2000).map(|i| format!("after-{i:04}")).collect();
    let names: Vec<String> = sqlx::query_scalar(
        "SELECT DISTINCT ON (hashtextextended(n, 0) & 63) n FROM unnest($1::text[]) n
         ORDER BY hashtextextended(n, 0) & 63, n",
    )
    .bind(&candidates)
    .fetch_all(&pg.pool)
    .await
    .unwrap();
    assert_eq!(names.len(), 64, "a name for every part");
    for n in &names {
        let node = NodeId::new(n.clone()).unwrap();
        store.register_node(&node, n, "test").await.unwrap();
        let t = Record::try_from(railguard_e2e::scripted::topo_rec(railguard_e2e::scripted::topology(
            &fixture::dgx_h100_like(),
            None,
        )))
        .unwrap();
        store.ingest(&node, vec![t], 0).await.unwrap();
    }
    let parts: i64 = sqlx::query_scalar("SELECT count(DISTINCT assess_part) FROM nodes WHERE node_id = ANY($1)")
        .bind(&names)
        .fetch_one(&pg.pool)
        .await
        .unwrap();
    assert_eq!(parts, 64, "the nodes fall in every part, as the collectors number them");
    wait::until_async("every new node assessed by the survivors", Duration::from_secs(60), async || {
        let n: i64 = sqlx::query_scalar("SELECT count(DISTINCT node_id) FROM gpu_status WHERE node_id = ANY($1)")
            .bind(&names)
            .fetch_one(&pg.pool)
            .await
            .unwrap();
        if n == names.len() as i64 { Ok(()) } else { Err(n) }
    })
    .await;
    // Every part's last pass is a survivor's, after the kill.
    let pids: Vec<String> = cs.iter().map(|c| format!(":{}", c.pid().unwrap())).collect();
    let rows: Vec<(i16, String, chrono::DateTime<chrono::Utc>)> =
        sqlx::query_as("SELECT part, holder, finished_at FROM assessment_parts ORDER BY part")
            .fetch_all(&pg.pool)
            .await
            .unwrap();
    assert_eq!(rows.len(), 64);
    wait::until_async("every part passed over by a survivor", Duration::from_secs(30), async || {
        let rows: Vec<(i16, String, chrono::DateTime<chrono::Utc>)> =
            sqlx::query_as("SELECT part, holder, finished_at FROM assessment_parts ORDER BY part")
                .fetch_all(&pg.pool)
                .await
                .unwrap();
        let stale: Vec<_> = rows
            .into_iter()
            .filter(|(_, holder, at)| *at <= killed_at || !pids.iter().any(|p| holder.ends_with(p.as_str())))
            .collect();
        if stale.is_empty() { Ok(()) } else { Err(format!("{stale:?}")) }
    })
    .await;
}
