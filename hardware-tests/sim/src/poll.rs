//! Waiting in tests for something another process or task does: one poll loop, so that every
//! test gives up the same way (after a deadline, naming what it waited for and, where the
//! caller can say it, what it saw last) and none depends on how fast the machine is.

use std::time::{Duration, Instant};

/// How often the loops below ask again.
const EVERY: Duration = Duration::from_millis(50);

/// Polls `f` until it returns `Some`, for up to `secs` seconds; panics naming `what` after that.
pub fn eventually<T>(secs: u64, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    eventually_or(secs, what, || f().ok_or_else(String::new))
}

/// [`eventually`] where `f` says what it saw instead of `None`: the panic repeats the last.
pub fn eventually_or<T>(secs: u64, what: &str, mut f: impl FnMut() -> Result<T, String>) -> T {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        match f() {
            Ok(v) => return v,
            Err(seen) if Instant::now() >= deadline => gave_up(what, &seen),
            Err(_) => std::thread::sleep(EVERY),
        }
    }
}

/// [`eventually`] for a test on tokio: `f` may await, and the wait yields to the runtime.
pub async fn eventually_async<T>(
    secs: u64,
    what: &str,
    mut f: impl AsyncFnMut() -> Option<T>,
) -> T {
    eventually_async_or(secs, what, async || f().await.ok_or_else(String::new)).await
}

/// [`eventually_or`] for a test on tokio.
pub async fn eventually_async_or<T>(
    secs: u64,
    what: &str,
    mut f: impl AsyncFnMut() -> Result<T, String>,
) -> T {
    match until(secs, EVERY, &mut f).await {
        Ok(v) => v,
        Err(seen) => gave_up(what, &seen),
    }
}

/// [`eventually_async`] for a bench: asks every `every` (a bench that times how long something
/// takes wants a finer grain than a test) and gives up with an error instead of a panic.
pub async fn until_async<T>(
    secs: u64,
    every: Duration,
    what: &str,
    mut f: impl AsyncFnMut() -> Option<T>,
) -> anyhow::Result<T> {
    until(secs, every, &mut async || f().await.ok_or_else(String::new))
        .await
        .map_err(|seen| anyhow::anyhow!("{}", message(what, &seen)))
}

async fn until<T>(
    secs: u64,
    every: Duration,
    f: &mut impl AsyncFnMut() -> Result<T, String>,
) -> Result<T, String> {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        match f().await {
            Ok(v) => return Ok(v),
            Err(seen) if Instant::now() >= deadline => return Err(seen),
            Err(_) => tokio::time::sleep(every).await,
        }
    }
}

fn message(what: &str, seen: &str) -> String {
    if seen.is_empty() {
        format!("timed out waiting for {what}")
    } else {
        format!("timed out waiting for {what}; last seen: {seen}")
    }
}

fn gave_up(what: &str, seen: &str) -> ! {
    panic!("{}", message(what, seen))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    #[test]
    fn eventually_returns_the_first_some() {
        let n = Cell::new(0);
        let got = eventually(5, "the third call", || {
            n.set(n.get() + 1);
            (n.get() == 3).then_some(n.get())
        });
        assert_eq!(got, 3);
    }

    #[test]
    #[should_panic(expected = "timed out waiting for nothing")]
    fn eventually_gives_up_naming_what_it_waited_for() {
        eventually(0, "nothing", || None::<()>);
    }

    #[test]
    #[should_panic(expected = "timed out waiting for eight; last seen: 7")]
    fn eventually_or_says_what_it_saw_last() {
        let n = Cell::new(0);
        eventually_or(0, "eight", || {
            n.set(n.get() + 7);
            Err::<(), _>(n.get().to_string())
        });
    }

    #[tokio::test]
    async fn the_async_forms_agree() {
        let n = Cell::new(0);
        let got = eventually_async(5, "two calls", async || {
            n.set(n.get() + 1);
            (n.get() == 2).then_some(n.get())
        })
        .await;
        assert_eq!(got, 2);
        let e = until_async(0, EVERY, "never", async || None::<()>).await;
        assert_eq!(
            e.map_err(|e| e.to_string()),
            Err("timed out waiting for never".to_string())
        );
    }
}
