//! The timer wheel: when to look at which node again, for transitions that
//! happen with time alone (grace periods, slow starts, flaps, crash-loop
//! restarts, retries).

use std::collections::{BTreeSet, HashMap};

use tokio::time::Instant;

/// At most one pending wakeup per node: the earliest asked for.
#[derive(Debug, Default)]
pub struct Wakeups {
    queue: BTreeSet<(Instant, String)>,
    by_node: HashMap<String, Instant>,
}

impl Wakeups {
    /// Asks to look at `node` at `at`, unless an earlier look is already due.
    pub fn schedule(&mut self, node: &str, at: Instant) {
        match self.by_node.get(node) {
            Some(&pending) if pending <= at => {}
            Some(&pending) => {
                self.queue.remove(&(pending, node.to_owned()));
                self.queue.insert((at, node.to_owned()));
                self.by_node.insert(node.to_owned(), at);
            }
            None => {
                self.queue.insert((at, node.to_owned()));
                self.by_node.insert(node.to_owned(), at);
            }
        }
    }

    /// When the next wakeup is due.
    pub fn next(&self) -> Option<Instant> {
        self.queue.first().map(|(at, _)| *at)
    }

    /// Takes the nodes due at `now`.
    pub fn take_due(&mut self, now: Instant) -> Vec<String> {
        let mut due = Vec::new();
        while let Some((at, _)) = self.queue.first() {
            if *at > now {
                break;
            }
            let (_, node) = self.queue.pop_first().expect("queue is not empty");
            self.by_node.remove(&node);
            due.push(node);
        }
        due
    }

    pub fn len(&self) -> usize {
        self.by_node.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_node.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn earliest_wakeup_per_node_wins() {
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        let mut wakeups = Wakeups::default();
        assert_eq!(wakeups.next(), None);
        wakeups.schedule("a", t0 + 5 * s);
        wakeups.schedule("a", t0 + 9 * s);
        wakeups.schedule("b", t0 + 3 * s);
        wakeups.schedule("b", t0 + 2 * s);
        assert_eq!(wakeups.len(), 2);
        assert_eq!(wakeups.next(), Some(t0 + 2 * s));
        assert!(wakeups.take_due(t0 + s).is_empty());
        assert_eq!(wakeups.take_due(t0 + 2 * s), ["b"]);
        assert_eq!(wakeups.next(), Some(t0 + 5 * s));
        assert_eq!(wakeups.take_due(t0 + 60 * s), ["a"]);
        assert!(wakeups.is_empty());
        assert_eq!(wakeups.next(), None);
    }
}
