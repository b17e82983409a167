//! Asking again at start-up: the requests one refusal of which must not end
//! the process or turn a feature off when asking again would do (the leader
//! Lease's read, device API discovery).

/// Runs `attempt` until it succeeds or fails in a way `may_pass` does not
/// excuse, waiting 0.5 s between tries, doubling up to 10 s. For the
/// start-up requests one refusal of which (a 429, a 5xx, a dropped
/// connection) must not end the process or turn a feature off when asking
/// again would do.
pub async fn retry_passing<T, E, F>(
    what: &str,
    may_pass: impl Fn(&E) -> bool,
    mut attempt: impl FnMut() -> F,
) -> Result<T, E>
where
    E: std::fmt::Display,
    F: std::future::Future<Output = Result<T, E>>,
{
    let mut delay = std::time::Duration::from_millis(500);
    loop {
        match attempt().await {
            Err(e) if may_pass(&e) => {
                tracing::warn!(error = %e, retry_in = ?delay, "{what} failed; retrying");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(std::time::Duration::from_secs(10));
            }
            result => return result,
        }
    }
}

#[cfg(test)]
mod tests {
    #[tokio::test]
    async fn refusals_that_may_pass_are_asked_again_and_others_returned_at_once() {
        let tries = std::cell::Cell::new(0);
        let r: Result<u32, String> = super::retry_passing(
            "test",
            |e: &String| e == "busy",
            || {
                tries.set(tries.get() + 1);
                let n = tries.get();
                async move {
                    if n < 2 {
                        Err("busy".to_string())
                    } else {
                        Ok(n)
                    }
                }
            },
        )
        .await;
        assert_eq!(r, Ok(2), "asked again after a refusal that may pass");
        tries.set(0);
        let r: Result<u32, String> = super::retry_passing(
            "test",
            |e: &String| e == "busy",
            || {
                tries.set(tries.get() + 1);
                async { Err("forbidden".to_string()) }
            },
        )
        .await;
        assert_eq!(r, Err("forbidden".to_string()));
        assert_eq!(tries.get(), 1, "a lasting refusal is not asked again");
    }
}
