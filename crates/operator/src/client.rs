//! The operator's Kubernetes API client: kube's stack (base URI, auth,
//! extra headers, server-aware retries, connect and write timeouts) over a
//! connection that speaks HTTP/2 when the API server offers it, as client-go
//! does.
//!
//! kube's own client speaks HTTP/1.1 only, where every request in flight
//! holds a TLS connection of its own (a handshake, and about 30 KB of
//! buffers and state, kept idle for 90 s after). With 50 SafeRollouts
//! starting stages together the operator held about 100 such connections at
//! 5,000 nodes (bench/results/2026-12-04-h2.md). Over HTTP/2 a client's
//! requests share one connection. The API server caps the streams of a
//! connection (`--http2-max-streams-per-connection`, Go's 250 when unset);
//! a request beyond the cap waits in the client for a stream to close rather
//! than fail, and the operator keeps far fewer in flight anyway (64 node and
//! pod writes, `API_WRITES_IN_FLIGHT`, plus its watches and status writes).
//!
//! The operator makes two clients, so two connections: one for its watches
//! (and its lease), one for its writes. The writer's writes go through the
//! leader fence ([`FenceLayer`]) on every attempt, retries included. Over one connection, a single task
//! reads and decrypts every frame, so a write's answer, or the next
//! deletion's request, can wait behind the watch events of the cluster's
//! nodes and agent pods. At 1,000 nodes and `maxUnavailable: 1`, from the
//! API server's Ready write for a new pod to the operator's next deletion
//! took 12.0-13.6 ms (mean 12.6) over one connection and 10.7-12.1 ms (mean
//! 11.4) over two, four runs each (audit log,
//! bench/results/2026-12-05-profile.md).

use std::sync::Arc;
use std::task::{Context, Poll};

use futures::future::BoxFuture;
use hyper_timeout::TimeoutConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use kube::client::ConfigExt;
use kube::client::retry::RetryPolicy;
use kube::{Client, Config};
use tower::{BoxError, Layer, Service, ServiceBuilder, retry::RetryLayer};

use crate::controller::freshness::{Freshness, TapLayer};
use crate::leader::{Admits, Fence};

/// A client for `config` (HTTP/2 over TLS where the server agrees to it by
/// ALPN; HTTP/1.1 otherwise, e.g. a plain-HTTP test server).
pub fn from_config(config: Config) -> kube::Result<Client> {
    build(config, None, None)
}

/// The caches' client: as [`from_config`], and every chunk its watches
/// receive, bookmarks included, marks their store heard in `freshness`.
pub fn watching(config: Config, freshness: Arc<Freshness>) -> kube::Result<Client> {
    build(config, None, Some(freshness))
}

/// A client whose writes (every method but GET and HEAD) are sent only
/// while `fence` is open and are given up at its deadline.
pub fn fenced(config: Config, fence: Arc<Fence>) -> kube::Result<Client> {
    build(config, Some(fence), None)
}

fn build(
    config: Config,
    fence: Option<Arc<Fence>>,
    freshness: Option<Arc<Freshness>>,
) -> kube::Result<Client> {
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    // Every watch and write shares one connection, so the client keeps
    // sending small frames (window updates, pings, request headers and bodies)
    // while earlier segments are unacknowledged: with Nagle's algorithm on,
    // a request's last segment waited for the API server's delayed ACK (up to
    // 40 ms on Linux). At 1,000 nodes a pod deletion took the API server
    // 17.6 ms mean and 44 ms p90 to complete against the DaemonSet
    // controller's 3.4 ms (audit log, bench/results/2026-12-04-nodelay.md).
    // client-go's dialer, like Go's net package, sets TCP_NODELAY too.
    http.set_nodelay(true);
    let tls = config.rustls_client_config()?;
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http();
    let https = match config.tls_server_name.as_deref() {
        Some(name) => https.with_server_name_resolver(hyper_rustls::FixedServerNameResolver::new(
            rustls::pki_types::ServerName::try_from(name.to_owned()).map_err(|e| {
                kube::Error::RustlsTls(kube::client::RustlsTlsError::InvalidServerName(e))
            })?,
        )),
        None => https,
    };
    let https = https.enable_all_versions().wrap_connector(http);
    let mut connector = TimeoutConnector::new(https);
    connector.set_connect_timeout(config.connect_timeout);
    connector.set_read_timeout(config.read_timeout);
    connector.set_write_timeout(config.write_timeout);
    let hyper = hyper_util::client::legacy::Client::builder(TokioExecutor::new())
        // HTTP/2 keep-alive pings need a timer (hyper panics without one).
        .timer(TokioTimer::new())
        .pool_timer(TokioTimer::new())
        // The receive windows stay hyper's (2 MB a stream, 5 MB the
        // connection): a 5,000-node initial list streams without waiting on
        // window updates, and nothing is buffered unless a reader lags.
        // A dead connection would take every watch with it: ping it while
        // idle so it is noticed and replaced.
        .http2_keep_alive_interval(std::time::Duration::from_secs(30))
        .http2_keep_alive_timeout(std::time::Duration::from_secs(15))
        .build(connector);
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        // A write, retries included, ends at the fence's deadline...
        .option_layer(fence.clone().map(|f| FenceLayer {
            fence: f,
            deadline: true,
        }))
        .option_layer(
            config
                .default_retry
                .then(|| RetryLayer::new(NotEvictions(RetryPolicy::server_retry()))),
        )
        // ... and each attempt, a retry's too, is sent only while the fence
        // is open.
        .option_layer(fence.map(|f| FenceLayer {
            fence: f,
            deadline: false,
        }))
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .layer(TapLayer(freshness))
        .map_err(BoxError::from)
        .service(hyper);
    Ok(Client::new(service, config.default_namespace))
}

/// kube's server-aware retries, except for evictions: an eviction's 429 is
/// a PodDisruptionBudget's answer (not now), not a busy API server. Retried
/// here it would be asked again until the leader fence's deadline and fail
/// the pass; the drain records the answer instead and asks again on its
/// next pass (`controller::maintenance`).
#[derive(Clone)]
struct NotEvictions(RetryPolicy);

fn is_eviction<B>(req: &http::Request<B>) -> bool {
    req.uri().path().ends_with("/eviction")
}

impl<Res> tower::retry::Policy<http::Request<kube::client::Body>, http::Response<Res>, BoxError>
    for NotEvictions
{
    type Future = tokio::time::Sleep;

    fn retry(
        &mut self,
        req: &mut http::Request<kube::client::Body>,
        result: &mut Result<http::Response<Res>, BoxError>,
    ) -> Option<Self::Future> {
        if is_eviction(req) {
            return None;
        }
        tower::retry::Policy::retry(&mut self.0, req, result)
    }

    fn clone_request(
        &mut self,
        req: &http::Request<kube::client::Body>,
    ) -> Option<http::Request<kube::client::Body>> {
        if is_eviction(req) {
            return None;
        }
        <RetryPolicy as tower::retry::Policy<
            http::Request<kube::client::Body>,
            http::Response<Res>,
            BoxError,
        >>::clone_request(&mut self.0, req)
    }
}

/// A write the leader fence stopped.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Fenced {
    /// The fence was closed: the write was not sent.
    #[error("the leader fence is closed; the write was not sent")]
    NotSent,
    /// The fence's deadline passed with the write in flight: the client gave
    /// it up (the API server may still have applied it, within the margin).
    #[error("the leader fence's deadline passed with the write in flight; given up")]
    GivenUp,
}

impl Fenced {
    /// The fence error behind a client error, if that is what it is.
    pub fn of(e: &kube::Error) -> Option<&Fenced> {
        match e {
            kube::Error::Service(e) => e.downcast_ref::<Fenced>(),
            _ => None,
        }
    }
}

/// Checks the leader fence before a write is sent and, with `deadline`,
/// gives it up at the fence's deadline; see [`crate::leader`].
#[derive(Clone)]
pub struct FenceLayer {
    fence: Arc<Fence>,
    deadline: bool,
}

impl<S> Layer<S> for FenceLayer {
    type Service = FencedService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        FencedService {
            inner,
            fence: self.fence.clone(),
            deadline: self.deadline,
        }
    }
}

/// The service [`FenceLayer`] makes.
#[derive(Clone)]
pub struct FencedService<S> {
    inner: S,
    fence: Arc<Fence>,
    deadline: bool,
}

impl<S, B> Service<http::Request<B>> for FencedService<S>
where
    S: Service<http::Request<B>, Error = BoxError>,
    S::Future: Send + 'static,
    S::Response: Send + 'static,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = BoxFuture<'static, Result<S::Response, BoxError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        // Reads change nothing another replica could contradict.
        if matches!(*request.method(), http::Method::GET | http::Method::HEAD) {
            return Box::pin(self.inner.call(request));
        }
        match self.fence.admits() {
            Admits::Always => Box::pin(self.inner.call(request)),
            Admits::Nothing => Box::pin(std::future::ready(Err(Fenced::NotSent.into()))),
            Admits::Until(_) if !self.deadline => Box::pin(self.inner.call(request)),
            Admits::Until(deadline) => {
                let write = self.inner.call(request);
                Box::pin(async move {
                    tokio::time::timeout_at(deadline.into(), write)
                        .await
                        .unwrap_or_else(|_| Err(Fenced::GivenUp.into()))
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::{BufRead, BufReader, Write};
    use std::net::{SocketAddr, TcpListener};
    use std::os::fd::BorrowedFd;

    /// The client's socket to `server`, found among the process's open file
    /// descriptors by its local address.
    fn nodelay_of_socket_at(local: SocketAddr) -> Option<bool> {
        for entry in std::fs::read_dir("/proc/self/fd").ok()?.flatten() {
            let Ok(fd) = entry.file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            // SAFETY: getsockname and getsockopt only read the descriptor's
            // state; one closed meanwhile (another test's) makes them fail,
            // and one reused names some other socket, whose address does not
            // match.
            let fd = unsafe { BorrowedFd::borrow_raw(fd) };
            let socket = socket2::SockRef::from(&fd);
            if socket.local_addr().ok().and_then(|a| a.as_socket()) == Some(local) {
                return socket.tcp_nodelay().ok();
            }
        }
        None
    }

    #[tokio::test]
    async fn the_client_sends_without_waiting_for_acks() {
        // A plain-HTTP API server that answers one /version request and
        // keeps the connection open (so the client's socket stays to inspect).
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let server = std::thread::spawn(move || {
            let (stream, client_addr) = listener.accept().unwrap();
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut line = String::new();
            while reader.read_line(&mut line).unwrap() > 2 {
                line.clear();
            }
            let body = r#"{"major":"1","minor":"35","gitVersion":"v1.35.0","gitCommit":"","gitTreeState":"","buildDate":"","goVersion":"","compiler":"","platform":""}"#;
            let mut out = &stream;
            write!(
                out,
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                body.len()
            )
            .unwrap();
            (stream, client_addr)
        });
        let config = kube::Config::new(url.parse().unwrap());
        let client = super::from_config(config).unwrap();
        client.apiserver_version().await.unwrap();
        // The server's end stays open until the check is done.
        let (_server_side, client_addr) = server.join().unwrap();
        assert_eq!(
            nodelay_of_socket_at(client_addr),
            Some(true),
            "the client's socket to the API server has Nagle's algorithm on (TCP_NODELAY unset)"
        );
        drop(client);
    }

    /// A plain-HTTP API server that answers every write with `status` (and
    /// `Retry-After: 1`) and every read with 404, recording each request's
    /// method and when it came.
    async fn serve(
        status: &'static str,
    ) -> (
        String,
        std::sync::Arc<std::sync::Mutex<Vec<(String, std::time::Instant)>>>,
    ) {
        use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let log = seen.clone();
        tokio::spawn(async move {
            loop {
                let (stream, _) = listener.accept().await.unwrap();
                let log = log.clone();
                tokio::spawn(async move {
                    let mut reader = tokio::io::BufReader::new(stream);
                    loop {
                        let mut head = String::new();
                        let mut length = 0usize;
                        loop {
                            let mut line = String::new();
                            if reader.read_line(&mut line).await.unwrap_or(0) == 0 {
                                return;
                            }
                            if let Some(v) =
                                line.to_ascii_lowercase().strip_prefix("content-length:")
                            {
                                length = v.trim().parse().unwrap_or(0);
                            }
                            if line == "\r\n" {
                                break;
                            }
                            head.push_str(&line);
                        }
                        let mut body = vec![0; length];
                        reader.read_exact(&mut body).await.unwrap();
                        let method = head.split(' ').next().unwrap_or_default().to_string();
                        log.lock()
                            .unwrap()
                            .push((method.clone(), std::time::Instant::now()));
                        let (status, body) = if method == "GET" {
                            (
                                "404 Not Found",
                                r#"{"kind":"Status","apiVersion":"v1","status":"Failure","message":"not found","reason":"NotFound","code":404}"#,
                            )
                        } else {
                            (
                                status,
                                r#"{"kind":"Status","apiVersion":"v1","status":"Failure","message":"slow down","reason":"TooManyRequests","code":429}"#,
                            )
                        };
                        let answer = format!(
                            "HTTP/1.1 {status}\r\ncontent-type: application/json\r\nretry-after: 1\r\ncontent-length: {}\r\n\r\n{body}",
                            body.len()
                        );
                        reader.get_mut().write_all(answer.as_bytes()).await.unwrap();
                    }
                });
            }
        });
        (url, seen)
    }

    fn delete(
        client: &kube::Client,
    ) -> impl std::future::Future<Output = kube::Result<serde_json::Value>> {
        let request = http::Request::delete("/api/v1/namespaces/x/pods/p")
            .body(Vec::new())
            .unwrap();
        let client = client.clone();
        async move { client.request::<serde_json::Value>(request).await }
    }

    #[tokio::test]
    async fn a_closed_fence_sends_no_write_and_an_open_one_bounds_its_retries() {
        use crate::leader::Fence;
        use std::time::{Duration, Instant};
        let (url, seen) = serve("429 Too Many Requests").await;
        let fence = Fence::elected();
        let client = super::fenced(kube::Config::new(url.parse().unwrap()), fence.clone()).unwrap();

        // Closed: the write never leaves the process; reads still go.
        let e = delete(&client).await.unwrap_err();
        assert_eq!(
            super::Fenced::of(&e),
            Some(&super::Fenced::NotSent),
            "{e:?}"
        );
        assert!(
            seen.lock().unwrap().is_empty(),
            "a write was sent through a closed fence"
        );
        let read = http::Request::get("/api/v1/namespaces/x/pods/p")
            .body(Vec::new())
            .unwrap();
        assert!(client.request::<serde_json::Value>(read).await.is_err());
        assert_eq!(seen.lock().unwrap().len(), 1, "the read was not sent");

        // Open until 600 ms from now; the server asks to retry after 1 s:
        // the retry would come after the deadline, so the write is given up
        // at the deadline and never sent again.
        fence.set_held(true);
        let deadline = Instant::now() + Duration::from_millis(600);
        fence.confirm_until(deadline);
        let e = delete(&client).await.unwrap_err();
        let given_up = Instant::now();
        assert_eq!(
            super::Fenced::of(&e),
            Some(&super::Fenced::GivenUp),
            "{e:?}"
        );
        assert!(given_up >= deadline && given_up < deadline + Duration::from_millis(300));
        // Past the Retry-After: nothing more arrived.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let seen = seen.lock().unwrap();
        let writes: Vec<_> = seen.iter().filter(|(m, _)| m == "DELETE").collect();
        assert_eq!(
            writes.len(),
            1,
            "a write was retried past the fence: {seen:?}"
        );
        assert!(writes[0].1 < deadline);
    }

    #[tokio::test]
    async fn an_evictions_refusal_is_returned_at_once_and_other_writes_are_retried() {
        use std::time::Duration;
        let (url, seen) = serve("429 Too Many Requests").await;
        let client = super::from_config(kube::Config::new(url.parse().unwrap())).unwrap();
        let evict = http::Request::post("/api/v1/namespaces/x/pods/p/eviction")
            .header("content-type", "application/json")
            .body(
                br#"{"apiVersion":"policy/v1","kind":"Eviction","metadata":{"name":"p"}}"#.to_vec(),
            )
            .unwrap();
        let e = client
            .request::<serde_json::Value>(evict)
            .await
            .unwrap_err();
        assert!(matches!(&e, kube::Error::Api(s) if s.code == 429), "{e:?}");
        assert_eq!(seen.lock().unwrap().len(), 1, "an eviction was asked again");
        // A deletion's 429 is a busy server's: asked again after Retry-After.
        let _ = tokio::time::timeout(Duration::from_millis(1500), delete(&client)).await;
        let deletes = seen
            .lock()
            .unwrap()
            .iter()
            .filter(|(m, _)| m == "DELETE")
            .count();
        assert!(deletes >= 2, "a deletion was not retried: {deletes}");
    }
}
