//! How current each cache is, and the reflector loop that keeps it so.
//!
//! A watch can go silent without ending: a proxy or load balancer that
//! stops forwarding, an API server stuck relisting, a connection that is
//! half dead. kube's watcher only notices when the request times out (about
//! 5 minutes), and meanwhile every decision reads a store frozen at the
//! moment the silence began: a pod that crashed still reads Ready, a
//! replaced one never shows its successor. Deciding on that can delete past
//! the budget, fail a stage on its deadline, or quarantine a healthy node.
//!
//! So each store records when it last *heard* from the API server: any event
//! its reflector delivered, and any bytes on its watch stream, which
//! includes the bookmarks the API server's watch cache sends every watcher
//! about once a minute (`defaultBookmarkFrequency` in k8s.io/apiserver's
//! cacher) even when nothing changes. Bookmarks never reach kube's watcher
//! stream, so the client's [`tap`] sees them on the wire, before kube does.
//! A store silent for longer than `--watch-stale-after` (default 90 s: a
//! missed bookmark and a half) is stale:
//! - every pass that reads it holds (see `controller::apply`): nothing is
//!   deleted, no gate is judged (so none fails on its deadline), nothing is
//!   quarantined; the SafeRollout says which store and since when;
//! - its reflector starts a new watch (a list then a watch), again every
//!   third of the bound while it stays silent, so the rollout resumes on its
//!   own once the API server answers.
//!
//! Per-node workload pod watches of the device gates are not tracked: they
//! come and go with the nodes a rollout holds, and the claims gate they feed
//! also reads the cluster-wide claims store, which is.

use std::collections::HashMap;
use std::fmt;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures::{FutureExt, StreamExt};
use jiff::Timestamp;
use kube::Resource;
use kube::api::Api;
use kube::runtime::reflector::store::Writer;
use kube::runtime::watcher::{self, Event};
use kube::runtime::{WatchStreamExt, watcher as watch};
use serde::de::DeserializeOwned;
use tracing::{debug, warn};

use crate::metrics::Metrics;

/// A watched store: the collection's path and its selectors, as the
/// watcher's requests carry them.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StoreKey {
    /// `/api/v1/namespaces/x/pods`, `/api/v1/nodes`, ...
    pub path: String,
    pub labels: Option<String>,
    pub fields: Option<String>,
}

impl StoreKey {
    pub fn of<K: Resource>(api: &Api<K>, config: &watcher::Config) -> Self {
        Self {
            path: api.resource_url().to_string(),
            labels: config.label_selector.clone(),
            fields: config.field_selector.clone(),
        }
    }

    /// The key a request of a watcher is for (`None`: not a watch or list of
    /// a collection, e.g. a GET of one object, which has more path).
    fn of_request(uri: &http::Uri) -> Self {
        let (mut labels, mut fields) = (None, None);
        for (k, v) in form_urlencoded::parse(uri.query().unwrap_or_default().as_bytes()) {
            match &*k {
                "labelSelector" => labels = Some(v.into_owned()),
                "fieldSelector" => fields = Some(v.into_owned()),
                _ => {}
            }
        }
        Self {
            path: uri.path().to_string(),
            labels,
            fields,
        }
    }

    /// Its labels in `saferollout_watch_stale`.
    fn labels(&self) -> crate::metrics::StoreLabels {
        crate::metrics::StoreLabels {
            resource: self.resource().into(),
            namespace: self.namespace().unwrap_or_default().into(),
            selector: format!(
                "{};{}",
                self.labels.as_deref().unwrap_or_default(),
                self.fields.as_deref().unwrap_or_default()
            ),
        }
    }

    /// The resource's plural (the path's last segment).
    pub fn resource(&self) -> &str {
        self.path.rsplit('/').next().unwrap_or_default()
    }

    /// The namespace, for a namespaced collection watched in one namespace.
    pub fn namespace(&self) -> Option<&str> {
        let mut segments = self.path.split('/');
        segments.find(|s| *s == "namespaces")?;
        segments.next()
    }
}

/// `pods in namespace x (labels: a)`, for conditions and logs.
impl fmt::Display for StoreKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.resource())?;
        match self.namespace() {
            Some(ns) => write!(f, " in namespace {ns}")?,
            None => write!(f, " (cluster-wide)")?,
        }
        let selectors: Vec<String> = [("labels", &self.labels), ("fields", &self.fields)]
            .into_iter()
            .filter_map(|(what, s)| s.as_ref().map(|s| format!("{what} {s}")))
            .collect();
        if !selectors.is_empty() {
            write!(f, " ({})", selectors.join(", "))?;
        }
        Ok(())
    }
}

/// When a store last heard from the API server, in milliseconds since the
/// process's [`Freshness`] began; a pass's request that it list again; and
/// whether it is listing now. While a list is under way the store still
/// holds what it had before (the reflector swaps it in whole when the list
/// ends), so what arrives meanwhile vouches for nothing: a pass woken by the
/// list's first objects would otherwise take the old contents for current,
/// and a deadline that passed while the watch was silent would fail a gate
/// on them (it did, in the silent-watch fault test).
#[derive(Default)]
struct Heard {
    /// When it last heard, in milliseconds since [`Freshness`] began (0
    /// until its first word: silence then counts from the start).
    at_ms: AtomicU64,
    /// A pass asks the store to list again.
    list_again: tokio::sync::Notify,
    /// A list is under way: nothing heard counts until it is stored.
    listing: AtomicBool,
}

/// Every tracked store's last word from the API server.
pub struct Freshness {
    epoch: Instant,
    /// The wall clock at `epoch`: a store's last word in wall-clock time is
    /// this plus its offset, the same from pass to pass (a status naming it
    /// does not change, so does not wake its controller).
    epoch_wall: Timestamp,
    stale_after: Duration,
    stores: RwLock<HashMap<StoreKey, Arc<Heard>>>,
}

/// A store silent past the bound.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stale {
    pub store: StoreKey,
    /// When it last heard anything (wall clock, whole seconds).
    pub since: Timestamp,
}

impl Freshness {
    pub fn new(stale_after: Duration) -> Arc<Self> {
        Arc::new(Self {
            epoch: Instant::now(),
            epoch_wall: Timestamp::now(),
            stale_after,
            stores: RwLock::default(),
        })
    }

    pub fn stale_after(&self) -> Duration {
        self.stale_after
    }

    /// Starts tracking `key`, as heard now (its reflector is starting).
    fn track(&self, key: &StoreKey) -> Arc<Heard> {
        let heard = self
            .stores
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .entry(key.clone())
            .or_default()
            .clone();
        self.mark(&heard);
        heard
    }

    fn heard_of(&self, key: &StoreKey) -> Option<Arc<Heard>> {
        self.stores
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(key)
            .cloned()
    }

    fn mark(&self, heard: &Heard) {
        if heard.listing.load(Ordering::Acquire) {
            return;
        }
        let now = self.epoch.elapsed().as_millis() as u64;
        heard.at_ms.fetch_max(now.max(1), Ordering::Relaxed);
    }

    /// How long `heard` has been silent.
    fn silence(&self, heard: &Heard) -> Duration {
        let at = Duration::from_millis(heard.at_ms.load(Ordering::Relaxed));
        self.epoch.elapsed().saturating_sub(at)
    }

    /// When `heard` was last marked, in wall-clock milliseconds.
    fn wall_clock_ms(&self, heard: &Heard) -> i64 {
        self.epoch_wall.as_millisecond() + heard.at_ms.load(Ordering::Relaxed) as i64
    }

    /// When `heard` was last marked, in wall-clock whole seconds.
    fn wall_clock(&self, heard: &Heard) -> Timestamp {
        let at = self.wall_clock_ms(heard);
        Timestamp::from_second(at.div_euclid(1000)).unwrap_or(self.epoch_wall)
    }

    /// When the stalest of the stores `wanted` picks last heard anything.
    pub fn heard_at(&self, wanted: impl Fn(&StoreKey) -> bool) -> Option<Timestamp> {
        self.stores
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|(k, _)| wanted(k))
            .map(|(_, heard)| self.wall_clock_ms(heard))
            .min()
            .and_then(|ms| Timestamp::from_millisecond(ms).ok())
    }

    /// Asks the reflectors of the stores `wanted` picks that have heard
    /// nothing since `since` to list again (a list is current by itself, so
    /// vouches for its store at once). Returns how many were asked.
    pub fn refresh(&self, since: Timestamp, wanted: impl Fn(&StoreKey) -> bool) -> usize {
        let since = since.as_millisecond();
        let stores = self.stores.read().unwrap_or_else(|e| e.into_inner());
        let mut asked = 0;
        for (_, heard) in stores
            .iter()
            .filter(|(k, h)| wanted(k) && self.wall_clock_ms(h) < since)
        {
            heard.list_again.notify_one();
            asked += 1;
        }
        asked
    }

    /// The stores `wanted` picks that are stale now, in key order.
    pub fn stale(&self, wanted: impl Fn(&StoreKey) -> bool) -> Vec<Stale> {
        let mut stale: Vec<Stale> = self
            .stores
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|(k, heard)| wanted(k) && self.silence(heard) > self.stale_after)
            .map(|(k, heard)| Stale {
                store: k.clone(),
                since: self.wall_clock(heard),
            })
            .collect();
        stale.sort_by(|a, b| a.store.cmp(&b.store));
        stale
    }
}

/// The least time between two lists of one store asked by passes.
const REFRESH_INTERVAL: Duration = Duration::from_secs(10);

/// Runs one reflector for as long as the process: list and watch `api`,
/// prune each object, store it, hand each event to `on_event`, and start
/// over (a list then a watch) when the store has heard nothing for the
/// bound. Its resource's plural names it in `saferollout_watch_restarts_total`.
#[allow(clippy::too_many_arguments)]
pub fn reflect<K>(
    api: Api<K>,
    config: watcher::Config,
    mut writer: Writer<K>,
    freshness: &Arc<Freshness>,
    metrics: &Arc<Metrics>,
    prune: impl Fn(&mut K) + Clone + Send + 'static,
    mut on_event: impl FnMut(&Event<K>) + Send + 'static,
) where
    K: Resource + Clone + DeserializeOwned + fmt::Debug + Send + Sync + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone + Send + Sync,
{
    let key = StoreKey::of(&api, &config);
    let resource = key.resource().to_string();
    let (freshness, metrics) = (freshness.clone(), metrics.clone());
    let heard = freshness.track(&key);
    let streaming = matches!(
        config.initial_list_strategy,
        watcher::InitialListStrategy::StreamingList
    );
    let start = move || {
        watch(api.clone(), config.clone())
            .default_backoff()
            .modify(prune.clone())
            .boxed()
    };
    tokio::spawn(async move {
        let mut stream = start();
        let mut listed = false;
        let mut restarted: Option<Instant> = None;
        let mut refreshed: Option<Instant> = None;
        // Checked often enough that a restart comes within a few seconds of
        // its due time, and the gauges are as fresh.
        let mut check = tokio::time::interval(
            (freshness.stale_after / 6).clamp(Duration::from_secs(1), Duration::from_secs(5)),
        );
        loop {
            tokio::select! {
                item = stream.next() => match item {
                    Some(Ok(ev)) => {
                        // `Init` says a list is starting: no word from the API
                        // server yet, and none counts until the list is stored.
                        if matches!(ev, Event::Init) {
                            heard.listing.store(true, Ordering::Release);
                        }
                        listed |= matches!(ev, Event::InitDone);
                        writer.apply_watcher_event(&ev);
                        // The store now holds what the event says: it vouches
                        // for now (a list's end included).
                        if matches!(ev, Event::InitDone) {
                            heard.listing.store(false, Ordering::Release);
                        }
                        if !matches!(ev, Event::Init | Event::InitApply(_)) {
                            freshness.mark(&heard);
                        }
                        on_event(&ev);
                    }
                    Some(Err(e)) if streaming && !listed => {
                        warn!(%resource, error = %e, "the first streaming list failed; the watcher backs off and retries (an API server with the WatchList feature turned off refuses streaming lists: run with --initial-list=paged)");
                        metrics.watch_restarted(&resource);
                    }
                    Some(Err(e)) => {
                        debug!(%resource, error = %e, "watch error; the watcher backs off and lists again");
                        metrics.watch_restarted(&resource);
                    }
                    // kube's watcher never ends; if it did, start over.
                    None => stream = start(),
                },
                // A pass asked for a list (see `Freshness::refresh`); not more
                // than once in `REFRESH_INTERVAL`, however many passes ask.
                _ = heard.list_again.notified() => {
                    if refreshed.is_none_or(|t| t.elapsed() >= REFRESH_INTERVAL) {
                        debug!(store = %key, "listing again: a deadline is due and this store has heard nothing since it passed");
                        refreshed = Some(Instant::now());
                        heard.listing.store(true, Ordering::Release);
                        stream = start();
                    }
                }
                _ = check.tick() => {
                    let silence = freshness.silence(&heard);
                    let stale = silence > freshness.stale_after;
                    metrics.set_store_stale(key.labels(), stale);
                    // Once stale, a new watch every third of the bound: one
                    // that is itself held silent does not hold the store.
                    let due = restarted.is_none_or(|t| t.elapsed() > freshness.stale_after / 3);
                    if stale && due {
                        warn!(store = %key, silent_for = ?silence, "the watch has delivered nothing, not even a bookmark, for longer than --watch-stale-after: the passes reading this store hold, and a new watch starts (a list, then a watch)");
                        metrics.watch_restarted(&resource);
                        restarted = Some(Instant::now());
                        heard.listing.store(true, Ordering::Release);
                        stream = start();
                    } else if !stale {
                        restarted = None;
                    }
                }
            }
        }
    });
}

/// Marks the stores' watch streams heard on every chunk they receive (an
/// event or a bookmark), beneath kube's client, which drops bookmarks.
/// Requests of untracked paths pass through untouched, and every request
/// without a [`Freshness`] (the writer's client).
#[derive(Clone)]
pub struct TapLayer(pub Option<Arc<Freshness>>);

impl<S> tower::Layer<S> for TapLayer {
    type Service = Tap<S>;
    fn layer(&self, inner: S) -> Tap<S> {
        Tap {
            inner,
            freshness: self.0.clone(),
        }
    }
}

#[derive(Clone)]
pub struct Tap<S> {
    inner: S,
    freshness: Option<Arc<Freshness>>,
}

impl<S, ReqBody, B> tower::Service<http::Request<ReqBody>> for Tap<S>
where
    S: tower::Service<http::Request<ReqBody>, Response = http::Response<B>>,
    S::Future: Send + 'static,
{
    type Response = http::Response<Tapped<B>>;
    type Error = S::Error;
    type Future = futures::future::BoxFuture<'static, Result<Self::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<ReqBody>) -> Self::Future {
        let watching = req
            .uri()
            .query()
            .is_some_and(|q| q.split('&').any(|p| p == "watch=true" || p == "watch=1"));
        let heard = self.freshness.as_ref().filter(|_| watching).and_then(|f| {
            f.heard_of(&StoreKey::of_request(req.uri()))
                .map(|h| (h, f.clone()))
        });
        self.inner
            .call(req)
            .map(|r| r.map(|resp| resp.map(|inner| Tapped { inner, heard })))
            .boxed()
    }
}

/// A response body that marks its store heard on every data frame.
pub struct Tapped<B> {
    inner: B,
    heard: Option<(Arc<Heard>, Arc<Freshness>)>,
}

impl<B: http_body::Body + Unpin> http_body::Body for Tapped<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<B::Data>, B::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if let (Poll::Ready(Some(Ok(frame))), Some((heard, freshness))) = (&polled, &self.heard)
            && frame.is_data()
        {
            freshness.mark(heard);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_maps_to_the_store_its_watcher_registered() {
        let uri: http::Uri = "/api/v1/namespaces/gpu/pods?allowWatchBookmarks=true&labelSelector=controller-revision-hash&resourceVersion=12&timeoutSeconds=290&watch=true"
            .parse()
            .unwrap();
        let key = StoreKey::of_request(&uri);
        assert_eq!(
            key,
            StoreKey {
                path: "/api/v1/namespaces/gpu/pods".into(),
                labels: Some("controller-revision-hash".into()),
                fields: None,
            }
        );
        assert_eq!(key.resource(), "pods");
        assert_eq!(key.namespace(), Some("gpu"));
        let encoded: http::Uri = "/api/v1/pods?fieldSelector=spec.nodeName%21%3D&watch=1"
            .parse()
            .unwrap();
        let key = StoreKey::of_request(&encoded);
        assert_eq!(key.fields.as_deref(), Some("spec.nodeName!="));
        assert_eq!(key.namespace(), None);
        assert_eq!(
            key.to_string(),
            "pods (cluster-wide) (fields spec.nodeName!=)"
        );
    }

    #[test]
    fn a_store_is_stale_only_once_silent_past_the_bound() {
        let freshness = Freshness::new(Duration::from_millis(500));
        let key = StoreKey {
            path: "/api/v1/nodes".into(),
            labels: None,
            fields: None,
        };
        let heard = freshness.track(&key);
        assert!(freshness.stale(|_| true).is_empty());
        std::thread::sleep(Duration::from_millis(600));
        let stale = freshness.stale(|_| true);
        assert_eq!(stale.len(), 1);
        assert_eq!(stale[0].store, key);
        // The same instant however late it is asked.
        assert_eq!(freshness.stale(|_| true), stale);
        assert!(stale[0].since <= Timestamp::now());
        assert!(freshness.stale(|k| k.resource() == "pods").is_empty());
        freshness.mark(&heard);
        assert!(freshness.stale(|_| true).is_empty());
    }
}
