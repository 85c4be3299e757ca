//! The scheduler's timing with tokio's paused clock and a driver that records its calls.
use super::*;
use crate::driver::PropertyConfig;

#[derive(Default)]
struct Rig {
    values: Vec<String>,
    /// (ms since start, indices) of each read.
    batches: Vec<(u64, Vec<usize>)>,
    writes: Vec<(usize, String)>,
    link_down: bool,
    connects: u32,
    /// Writes of 77 answered with an exception before one is taken.
    busy: u32,
    /// The driver keeps the values it gave and says [`ReadValue::Same`] for an unchanged one.
    keeps: bool,
    /// The last value given for each property.
    given: BTreeMap<usize, String>,
    /// Say `Same` for property 0 whatever was given (a driver's mistake).
    same_always: bool,
}

struct Fake {
    rig: Arc<Mutex<Rig>>,
    start: Instant,
    subscribed: Vec<bool>,
    changes: mpsc::UnboundedReceiver<Reading>,
}

impl Driver for Fake {
    async fn connect(&mut self) -> Result<(), DriverError> {
        let mut r = self.rig.lock().expect("rig");
        r.connects += 1;
        if r.link_down {
            Err(DriverError::link("connection refused"))
        } else {
            Ok(())
        }
    }
    async fn read(&mut self, due: &[usize]) -> Vec<crate::driver::Reading> {
        let mut r = self.rig.lock().expect("rig");
        let at = self.start.elapsed().as_millis() as u64;
        r.batches.push((at, due.to_vec()));
        due.iter()
            .map(|&i| {
                if r.link_down {
                    (i, Err(DriverError::link("broken pipe")))
                } else if (r.keeps && r.given.get(&i) == Some(&r.values[i]))
                    || (r.same_always && i == 0)
                {
                    (i, Ok(ReadValue::Same))
                } else {
                    let v = r.values[i].clone();
                    r.given.insert(i, v.clone());
                    (i, Ok(v.into()))
                }
            })
            .collect()
    }
    async fn write(&mut self, index: usize, value: &str) -> Result<(), DriverError> {
        let mut r = self.rig.lock().expect("rig");
        r.writes.push((index, value.to_string()));
        if value == "77" && r.busy > 0 {
            r.busy -= 1;
            return Err(DriverError::device(
                "the device answered with exception ServerDeviceBusy",
            ));
        }
        // The device holds at most 120.
        if value.parse::<i64>().is_ok_and(|v| v > 120) {
            return Err(DriverError::config(format!(
                "{value} is above the maximum 120"
            )));
        }
        r.values[index] = value.to_string();
        Ok(())
    }
    async fn stop(&mut self) {}
    async fn changes(&mut self) -> Vec<Reading> {
        match self.changes.recv().await {
            Some(r) => vec![r],
            None => std::future::pending().await,
        }
    }
    fn subscribed(&self, index: usize) -> bool {
        self.subscribed.get(index).copied().unwrap_or(false)
    }
}

type Started = (
    Arc<Mutex<Rig>>,
    mpsc::Receiver<Report>,
    mpsc::Sender<Command>,
    CancellationToken,
);

fn start(cycles: &[(u64, u64)]) -> Started {
    start_subscribed(cycles, &[]).0
}

fn start_subscribed(
    cycles: &[(u64, u64)],
    subscribed: &[bool],
) -> (Started, mpsc::UnboundedSender<Reading>) {
    let rig = Arc::new(Mutex::new(Rig {
        values: cycles.iter().map(|_| "1".to_string()).collect(),
        ..Rig::default()
    }));
    let config = DeviceConfig {
        namespace: "default".into(),
        name: "d".into(),
        protocol: Default::default(),
        properties: (0..cycles.len())
            .map(|i| PropertyConfig {
                name: format!("p{i}"),
                writable: true,
                ..PropertyConfig::default()
            })
            .collect(),
    };
    let schedule = Schedule {
        properties: cycles
            .iter()
            .map(|&(c, r)| PropertySchedule {
                collect: Duration::from_millis(c),
                report: Duration::from_millis(r),
                push: Vec::new(),
            })
            .collect(),
        state_cycle: None,
    };
    let (rtx, rrx) = mpsc::channel(100);
    let (ctx, crx) = mpsc::channel(10);
    let (changes_tx, changes_rx) = mpsc::unbounded_channel();
    let task = DeviceTask::new(
        &config,
        &schedule,
        Fake {
            rig: rig.clone(),
            start: Instant::now(),
            subscribed: subscribed.to_vec(),
            changes: changes_rx,
        },
        rtx,
        Arc::new(Metrics::default()),
        Arc::new(Mutex::new(Snapshot::default())),
    );
    let cancel = CancellationToken::new();
    tokio::spawn(task.run(crx, cancel.clone()));
    ((rig, rrx, ctx, cancel), changes_tx)
}

fn twins(rx: &mut mpsc::Receiver<Report>) -> Vec<Vec<(String, String)>> {
    let mut out = Vec::new();
    while let Ok(r) = rx.try_recv() {
        if let Report::Twins { twins, .. } = r {
            out.push(twins.into_iter().map(|t| (t.property, t.value)).collect());
        }
    }
    out
}

fn states(rx: &mut mpsc::Receiver<Report>) -> Vec<&'static str> {
    let mut out = Vec::new();
    while let Ok(r) = rx.try_recv() {
        if let Report::State { state, .. } = r {
            out.push(state);
        }
    }
    out
}

#[tokio::test(start_paused = true)]
async fn properties_due_together_are_read_in_one_batch() {
    let (rig, _rx, _tx, cancel) = start(&[(1000, 1000), (1000, 1000), (2000, 1000)]);
    tokio::time::sleep(Duration::from_millis(4500)).await;
    cancel.cancel();
    let batches = rig.lock().expect("rig").batches.clone();
    assert_eq!(
        batches,
        vec![
            (0, vec![0, 1, 2]),
            (1000, vec![0, 1]),
            (2000, vec![0, 1, 2]),
            (3000, vec![0, 1]),
            (4000, vec![0, 1, 2]),
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn changes_are_reported_at_once_and_unchanged_values_at_the_report_cycle() {
    let (rig, mut rx, _tx, cancel) = start(&[(100, 1000)]);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(
        twins(&mut rx),
        vec![vec![("p0".to_string(), "1".to_string())]]
    );
    // Unchanged: nothing until the report cycle has passed.
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(twins(&mut rx).is_empty());
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(twins(&mut rx).len(), 1, "re-reported at 1000 ms");
    // A change goes out at the next read, not at the report cycle.
    rig.lock().expect("rig").values[0] = "2".into();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        twins(&mut rx),
        vec![vec![("p0".to_string(), "2".to_string())]]
    );
    cancel.cancel();
}

#[tokio::test(start_paused = true)]
async fn a_dead_link_goes_offline_backs_off_and_comes_back_online() {
    let (rig, mut rx, _tx, cancel) = start(&[(100, 1000)]);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(states(&mut rx), vec!["online"]);
    rig.lock().expect("rig").link_down = true;
    tokio::time::sleep(Duration::from_millis(3000)).await;
    assert_eq!(states(&mut rx), vec!["offline"]);
    // Backoff 0.5 s, 1 s, 2 s...: a handful of attempts in 3 s, not one per 100 ms cycle.
    let connects = rig.lock().expect("rig").connects;
    assert!((3..=5).contains(&connects), "{connects} connects");
    rig.lock().expect("rig").link_down = false;
    tokio::time::sleep(Duration::from_millis(5000)).await;
    assert_eq!(states(&mut rx), vec!["online"]);
    cancel.cancel();
}

#[tokio::test(start_paused = true)]
async fn a_desired_value_is_written_once_and_read_back_at_once() {
    let (rig, mut rx, tx, cancel) = start(&[(10_000, 10_000)]);
    tokio::time::sleep(Duration::from_millis(50)).await;
    let _ = twins(&mut rx);
    tx.send(Command::Desired(vec![("p0".into(), "7".into())]))
        .await
        .expect("task runs");
    tokio::time::sleep(Duration::from_millis(50)).await;
    let mut reported = Vec::new();
    while let Ok(r) = rx.try_recv() {
        if let Report::Twins { twins, .. } = r {
            reported.extend(twins);
        }
    }
    assert_eq!(reported.len(), 1, "{reported:?}");
    assert_eq!(reported[0].value, "7");
    assert_eq!(reported[0].observed_desired.as_deref(), Some("7"));
    // The same desired value again writes nothing.
    tx.send(Command::Desired(vec![("p0".into(), "7".into())]))
        .await
        .expect("task runs");
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(rig.lock().expect("rig").writes, vec![(0, "7".to_string())]);
    cancel.cancel();
}

/// 130 is refused, 85 and 95 are written, 130 again is tried again and refused again: a
/// value refused once is not refused silently for good.
#[tokio::test(start_paused = true)]
async fn a_value_refused_before_is_tried_again_once_another_was_written() {
    let (rig, mut rx, tx, cancel) = start(&[(10_000, 10_000)]);
    tokio::time::sleep(Duration::from_millis(50)).await;
    let mut refusals = Vec::new();
    for want in ["130", "85", "95", "130", "130"] {
        tx.send(Command::Desired(vec![("p0".into(), want.into())]))
            .await
            .expect("task runs");
        tokio::time::sleep(Duration::from_millis(50)).await;
        while let Ok(r) = rx.try_recv() {
            if let Report::WriteRefused { desired, error, .. } = r {
                refusals.push(format!("{desired}: {error}"));
            }
        }
    }
    let writes: Vec<String> = (rig.lock().expect("rig").writes.iter())
        .map(|(_, v)| v.clone())
        .collect();
    // The last 130 is the same desired value as the one before: not tried a third time.
    assert_eq!(writes, ["130", "85", "95", "130"]);
    assert_eq!(
        refusals,
        [
            "130: 130 is above the maximum 120",
            "130: 130 is above the maximum 120"
        ]
    );
    assert_eq!(
        rig.lock().expect("rig").values[0],
        "95",
        "the last value that fits"
    );
    cancel.cancel();
}

/// A write the device answers with an exception is tried again after 1 s, 2 s, 4 s (not at
/// every cycle), said in the twin once (not at every try), and lands when the device takes
/// it.
#[tokio::test(start_paused = true)]
async fn a_write_the_device_answers_with_an_error_is_retried_with_a_growing_wait() {
    let (rig, mut rx, tx, cancel) = start(&[(100, 10_000)]);
    rig.lock().expect("rig").busy = 3;
    tokio::time::sleep(Duration::from_millis(50)).await;
    tx.send(Command::Desired(vec![("p0".into(), "77".into())]))
        .await
        .expect("task runs");
    let tries = |rig: &Arc<Mutex<Rig>>| rig.lock().expect("rig").writes.len();
    let mut seen = Vec::new();
    for ms in [50, 900, 1_000, 2_000, 4_000] {
        tokio::time::sleep(Duration::from_millis(ms)).await;
        seen.push(tries(&rig));
    }
    // Tried at once, again after 1 s, 2 s and 4 s, where the device takes it.
    assert_eq!(seen, [1, 1, 2, 3, 4]);
    assert_eq!(rig.lock().expect("rig").values[0], "77");
    let mut refusals = Vec::new();
    while let Ok(r) = rx.try_recv() {
        if let Report::WriteRefused { desired, error, .. } = r {
            refusals.push(format!("{desired}: {error}"));
        }
    }
    assert_eq!(
        refusals,
        [
            "77: the device answered with exception ServerDeviceBusy (not written; tried again after a growing wait, at most every 60 s)"
        ]
    );
    tokio::time::sleep(Duration::from_secs(120)).await;
    assert_eq!(tries(&rig), 4, "not written again once it landed");
    assert_eq!(retry_wait(1), Duration::from_secs(1));
    assert_eq!(retry_wait(30), RETRY_MAX);
    cancel.cancel();
}

#[tokio::test(start_paused = true)]
async fn subscribed_properties_are_not_polled_and_their_changes_are_reported() {
    let ((rig, mut rx, _tx, cancel), changes) =
        start_subscribed(&[(100, 1000), (100, 1000)], &[false, true]);
    tokio::time::sleep(Duration::from_millis(350)).await;
    let batches = rig.lock().expect("rig").batches.clone();
    assert!(!batches.is_empty());
    assert!(
        batches.iter().all(|(_, due)| due == &vec![0]),
        "{batches:?}"
    );
    let _ = twins(&mut rx);
    changes.send((1, Ok("42".into()))).expect("task runs");
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(
        twins(&mut rx),
        vec![vec![("p1".to_string(), "42".to_string())]]
    );
    // Unchanged, it is reported again at its report cycle (1 s), not at every collect cycle.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let again: Vec<_> = twins(&mut rx)
        .into_iter()
        .flatten()
        .filter(|(p, _)| p == "p1")
        .collect();
    assert_eq!(again, vec![("p1".to_string(), "42".to_string())]);
    // A bad value for one subscribed property does not make the device unhealthy.
    changes
        .send((1, Err(DriverError::device("BadSensorFailure"))))
        .expect("task runs");
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(states(&mut rx), Vec::<&str>::new());
    // A lost session does take it offline, and it is connected again.
    let connects = rig.lock().expect("rig").connects;
    changes
        .send((1, Err(DriverError::link("session closed"))))
        .expect("task runs");
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(states(&mut rx), vec!["offline"]);
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert!(rig.lock().expect("rig").connects > connects);
    assert_eq!(states(&mut rx), vec!["online"]);
    cancel.cancel();
}

#[tokio::test(start_paused = true)]
async fn a_driver_saying_same_gets_its_kept_value_reported_read_and_re_reported() {
    let (rig, mut rx, tx, cancel) = start(&[(100, 1000), (100, 1000)]);
    rig.lock().expect("rig").keeps = true;
    rig.lock().expect("rig").values[1] = "b".into();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let p = |v: &[(&str, &str)]| -> Vec<(String, String)> {
        v.iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    };
    assert_eq!(twins(&mut rx), vec![p(&[("p0", "1"), ("p1", "b")])]);
    // Unchanged (the driver says Same): nothing until the report cycle, then the kept values.
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(twins(&mut rx).is_empty());
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(twins(&mut rx), vec![p(&[("p0", "1"), ("p1", "b")])]);
    // One changes: it alone goes out at the next read, with its own value.
    rig.lock().expect("rig").values[0] = "2".into();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(twins(&mut rx), vec![p(&[("p0", "2")])]);
    // A read on demand of a property the driver says is the same answers its kept value.
    let (reply, answer) = oneshot::channel();
    tx.send(Command::Read("p1".into(), reply))
        .await
        .expect("device task");
    assert_eq!(answer.await.expect("answer"), Ok("b".to_string()));
    cancel.cancel();
}

#[tokio::test(start_paused = true)]
async fn same_before_any_value_is_no_value_and_the_others_carry_on() {
    let (rig, mut rx, tx, cancel) = start(&[(100, 1000), (100, 1000)]);
    rig.lock().expect("rig").same_always = true;
    tokio::time::sleep(Duration::from_millis(250)).await;
    // p0 never had a value: nothing is reported for it, and nothing invented.
    assert_eq!(
        twins(&mut rx),
        vec![vec![("p1".to_string(), "1".to_string())]]
    );
    let (reply, answer) = oneshot::channel();
    tx.send(Command::Read("p0".into(), reply))
        .await
        .expect("device task");
    assert!(answer.await.expect("answer").is_err());
    cancel.cancel();
}
