//! Watch events as the API server delivers them, stamped on arrival: the
//! reaction times are differences between two such stamps (the failing
//! observation and the operator's write), both delivered to this process by
//! the same API server, so the delivery delay cancels out to first order.

use std::fmt::Debug;

use futures::StreamExt;
use jiff::Timestamp;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::Resource;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use saferollout_api::SafeRollout;
use serde::de::DeserializeOwned;
use tokio::sync::mpsc::UnboundedSender;
use tokio::task::JoinHandle;

/// One watch event.
pub enum Obs {
    Pod(Event<Pod>),
    Node(Event<Node>),
    DaemonSet(Event<DaemonSet>),
    Rollout(Event<SafeRollout>),
    Slice(Event<ResourceSlice>),
}

/// An event and when it arrived.
pub struct Stamped {
    pub at: Timestamp,
    pub obs: Obs,
}

/// Watches `api` (a list, then a watch) and sends every event, stamped, to `tx`.
pub fn spawn<K>(
    api: Api<K>,
    config: watcher::Config,
    wrap: fn(Event<K>) -> Obs,
    tx: UnboundedSender<Stamped>,
) -> JoinHandle<()>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(watcher::watcher(api, config).default_backoff());
        while let Some(ev) = stream.next().await {
            let at = Timestamp::now();
            match ev {
                Ok(ev) => {
                    if tx.send(Stamped { at, obs: wrap(ev) }).is_err() {
                        return;
                    }
                }
                Err(e) => eprintln!("bench: watch error (the watcher retries): {e}"),
            }
        }
    })
}

/// Milliseconds from `a` to `b`.
pub fn ms(a: Timestamp, b: Timestamp) -> f64 {
    b.duration_since(a).as_secs_f64() * 1000.0
}
