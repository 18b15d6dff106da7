//! A raw-bytes gRPC transport on tonic: `WireChannel` and `WireStream` (a client), `WireServer`
//! (a server for any method path, each call handed to a Python `dispatch` on its own thread).
//!
//! Mirrors `python/rlmesh/_pycore/wire/transport.py` (the same API over grpcio), which is the
//! specification. Messages are bytes both ways through a pass-through codec: Rust never parses
//! protobuf; the caller keeps every message and all protocol logic.
//!
//! The client owns a current-thread tokio runtime that only the caller's blocking calls drive
//! (with the GIL released), so a round trip costs no thread hand-off: `send` queues into the
//! request stream, and the following `receive` writes it and waits for the answer. The server
//! runs HTTP/2 on a one-worker runtime and each call's Python side on a thread of its own,
//! handing messages over through channels.
//!
//! A lone waiter whose waits are short polls for a while before it parks (`POLL`): a
//! server's HTTP/2 side waiting for a call's next request when that call is the server's only
//! open one, and a client's `receive` when no other waits in the process. See `POLL` for why.
//! It changes only how soon a message is seen: the Python core, which does not poll, behaves
//! the same.

use std::convert::Infallible;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use bytes::{Buf, BufMut, Bytes};
use hyper_util::rt::TokioIo;
use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyOSError, PyTimeoutError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::pybacked::PyBackedBytes;
use pyo3::types::{PyBytes, PyList, PyTuple};
use tokio::runtime::Runtime;
use tokio::sync::{mpsc, oneshot, watch};
use tokio_stream::wrappers::{UnboundedReceiverStream, UnixListenerStream};
use tokio_stream::Stream;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::metadata::{AsciiMetadataKey, AsciiMetadataValue};
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Channel, Endpoint};
use tonic::{CancellationHandle, Code, Request, Status, Streaming};

create_exception!(
    rlmesh._core,
    WireStatusError,
    PyException,
    "A channel or stream call that ended with a gRPC status other than OK: `code` is the status \
     name, `details` its message; str(err) == f\"{code}: {details}\"."
);

/// gRPC's status names by code number.
const CODE_NAMES: [&str; 17] = [
    "OK",
    "CANCELLED",
    "UNKNOWN",
    "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED",
    "NOT_FOUND",
    "ALREADY_EXISTS",
    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION",
    "ABORTED",
    "OUT_OF_RANGE",
    "UNIMPLEMENTED",
    "INTERNAL",
    "UNAVAILABLE",
    "DATA_LOSS",
    "UNAUTHENTICATED",
];
/// gRPC's own headers, which never reach dispatch (the same set as the Python core drops).
const RESERVED_HEADERS: [&str; 3] = ["te", "content-type", "user-agent"];
/// Messages buffered between a server call's HTTP/2 side and its Python thread, each way.
const CALL_QUEUE: usize = 16;
/// How often a client's blocking call lets the runtime run other work when it only needs the
/// wire written (half-close, cancel, close).
const FLUSH_ROUNDS: usize = 8;
/// How long a lone waiter polls before it parks its thread: a server's HTTP/2 side waiting for
/// a call's next request (when that call is the server's only open one) and a client's
/// `receive` (when no other waits in the process). Waking a parked thread costs the waker an
/// interrupt to another CPU: on a virtual machine about 0.15 ms of its CPU, and as long again
/// before the thread runs. The message usually comes within a millisecond (a driver's round,
/// an env's step), and one that finds its reader polling wakes no one. A poller yields its
/// thread's CPU between polls, not only its task, so the thread that carries the message, or
/// other work, runs first; many waiters never spin together.
///
/// On a server the HTTP/2 side polls, not the call's Python thread: its socket reads and the
/// responses the Python thread queues then find it awake, so neither wakes it, and the Python
/// thread, parked while it waits, leaves the CPUs to the one poller and the driver. (With the
/// Python thread polling instead, a bare echo took 83 µs a round trip; with the HTTP/2 side
/// polling, 59 µs. Both polling made the echo faster still, but a served env, whose Python
/// thread has work to do, gained almost nothing: three threads crowded two CPUs.)
///
/// A waiter polls only when its previous wait ended within `POLL`, and now and then in a run
/// of longer ones (`LongWaits`): a waiter whose messages take longer (a slow simulator's step,
/// a model's forward pass) would only take CPU from the work it waits for. Under Linux's
/// autogroup scheduling that work may run in another session (a server started in its own
/// terminal), which gets only an equal share of the CPUs against the poller's, however many
/// processes it runs. (A served CPU-heavy env in 2 worker processes, its server in its own
/// session: 1.32x one worker with every wait polled, 1.71x with this rule; BENCHMARKS.md.)
const POLL: Duration = Duration::from_millis(2);
/// The `receive` calls waiting in this process (only a lone one polls).
static RECEIVING: AtomicUsize = AtomicUsize::new(0);

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn code_name(code: Code) -> &'static str {
    CODE_NAMES.get(code as usize).copied().unwrap_or("UNKNOWN")
}

/// A `WireStatusError` with its `code` and `details` set on the instance.
fn status_error(py: Python<'_>, code: &str, details: &str) -> PyErr {
    let err = WireStatusError::new_err(format!("{code}: {details}"));
    let value = err.value(py);
    // setting two str attributes on a fresh exception cannot fail in practice
    let _ = value.setattr("code", code);
    let _ = value.setattr("details", details);
    err
}

/// Why a client call did not return a message, carried out of the GIL-free part.
#[derive(Clone, Debug)]
enum Failure {
    Status { code: &'static str, details: String },
    Timeout(f64),
    Value(String),
}

impl Failure {
    fn status(code: &'static str, details: impl Into<String>) -> Self {
        Failure::Status {
            code,
            details: details.into(),
        }
    }

    /// A status that reached the client; a broken connection is UNAVAILABLE, as in grpcio.
    fn of(status: &Status) -> Self {
        let code = if connection_broke(status) {
            Code::Unavailable
        } else {
            oversize_as_exhausted(status).code()
        };
        Failure::status(code_name(code), status.message())
    }

    fn into_err(self, py: Python<'_>) -> PyErr {
        match self {
            Failure::Status { code, details } => status_error(py, code, &details),
            Failure::Timeout(seconds) => {
                PyTimeoutError::new_err(format!("no message within {seconds} s"))
            }
            Failure::Value(message) => PyValueError::new_err(message),
        }
    }
}

/// Whether `status` is the connection failing under a call (reset, closed, unreadable), which
/// tonic reports as UNKNOWN or INTERNAL.
fn connection_broke(status: &Status) -> bool {
    if !matches!(status.code(), Code::Unknown | Code::Internal) {
        return false;
    }
    let mut source = std::error::Error::source(status);
    while let Some(cause) = source {
        if cause.is::<std::io::Error>() {
            return true;
        }
        source = cause.source();
    }
    status
        .message()
        .contains("error reading a body from connection")
}

/// tonic refuses a message over the size limit with OUT_OF_RANGE; gRPC (and grpcio) says
/// RESOURCE_EXHAUSTED.
fn oversize_as_exhausted(status: &Status) -> Status {
    if status.code() == Code::OutOfRange && status.message().contains("message length too large") {
        Status::resource_exhausted(status.message())
    } else {
        Status::new(status.code(), status.message())
    }
}

fn cancelled() -> Failure {
    Failure::status("CANCELLED", "the stream was cancelled")
}

fn closed_channel() -> Failure {
    Failure::status("CANCELLED", "the channel is closed")
}

/// An error and its sources, as one line.
fn describe(err: &(dyn std::error::Error + 'static)) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

fn seconds(value: Option<f64>, what: &str) -> PyResult<Option<Duration>> {
    match value {
        None => Ok(None),
        Some(s) if s.is_finite() && s >= 0.0 => Ok(Some(Duration::from_secs_f64(s))),
        Some(s) => Err(PyValueError::new_err(format!(
            "{what} must be a non-negative number of seconds or None, got {s}"
        ))),
    }
}

// ------------------------------------------------------------------------------ the codec

/// The pass-through codec: a message is its bytes.
#[derive(Clone, Copy, Debug, Default)]
struct RawCodec;

impl Codec for RawCodec {
    type Encode = Bytes;
    type Decode = Bytes;
    type Encoder = RawCodec;
    type Decoder = RawCodec;

    fn encoder(&mut self) -> Self::Encoder {
        RawCodec
    }

    fn decoder(&mut self) -> Self::Decoder {
        RawCodec
    }
}

impl Encoder for RawCodec {
    type Item = Bytes;
    type Error = Status;

    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put(item);
        Ok(())
    }
}

impl Decoder for RawCodec {
    type Item = Bytes;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Status> {
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }
}

// ------------------------------------------------------------------------------ targets

/// `"host:port"` (TCP) or `"unix:///abs/path"` / `"unix:rel/path"`.
enum Target {
    Tcp(String),
    Unix(PathBuf),
}

impl Target {
    fn parse(target: &str) -> Self {
        match target
            .strip_prefix("unix://")
            .or_else(|| target.strip_prefix("unix:"))
        {
            Some(path) => Target::Unix(PathBuf::from(path)),
            None => Target::Tcp(target.to_owned()),
        }
    }
}

// ------------------------------------------------------------------------------ the client

struct ChannelCore {
    target: String,
    runtime: Runtime,
    max_message_bytes: usize,
    channel: Mutex<Option<Channel>>,
    streams: Mutex<Vec<Weak<StreamCore>>>,
}

impl ChannelCore {
    fn channel(&self) -> Result<Channel, Failure> {
        lock(&self.channel).clone().ok_or_else(closed_channel)
    }

    fn client(&self, channel: Channel) -> tonic::client::Grpc<Channel> {
        tonic::client::Grpc::new(channel)
            .max_decoding_message_size(self.max_message_bytes)
            .max_encoding_message_size(self.max_message_bytes)
    }

    /// Let the connection's tasks run for a moment, so what was queued reaches the wire.
    fn flush(&self) {
        self.runtime.block_on(async {
            for _ in 0..FLUSH_ROUNDS {
                tokio::task::yield_now().await;
            }
        });
    }
}

async fn connect_once(target: &Target, timeout: Duration) -> Result<Channel, String> {
    match target {
        Target::Tcp(address) => {
            let endpoint = Endpoint::from_shared(format!("http://{address}"))
                .map_err(|err| describe(&err))?
                .tcp_nodelay(true)
                .connect_timeout(timeout);
            endpoint.connect().await.map_err(|err| describe(&err))
        }
        Target::Unix(path) => {
            let path = path.clone();
            let endpoint = Endpoint::from_static("http://localhost").connect_timeout(timeout);
            let connector = tower::service_fn(move |_: http::Uri| {
                let path = path.clone();
                async move {
                    let stream = tokio::net::UnixStream::connect(path).await?;
                    Ok::<_, std::io::Error>(TokioIo::new(stream))
                }
            });
            endpoint
                .connect_with_connector(connector)
                .await
                .map_err(|err| describe(&err))
        }
    }
}

/// Dial until connected or `timeout` passed, as grpcio's `channel_ready_future` does.
async fn connect(target: &Target, timeout: Duration) -> Result<Channel, String> {
    let deadline = tokio::time::Instant::now() + timeout;
    let mut pause = Duration::from_millis(10);
    let mut last = String::from("timed out");
    loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        match tokio::time::timeout_at(deadline, connect_once(target, left)).await {
            Ok(Ok(channel)) => return Ok(channel),
            Ok(Err(reason)) => last = reason,
            Err(_) => return Err(last),
        }
        if tokio::time::Instant::now() + pause >= deadline {
            return Err(last);
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(200));
    }
}

fn request_with<T>(
    message: T,
    metadata: &[(String, String)],
    timeout: Option<Duration>,
) -> Result<Request<T>, Failure> {
    let mut request = Request::new(message);
    for (key, value) in metadata {
        let name = AsciiMetadataKey::from_bytes(key.as_bytes()).map_err(|_| {
            Failure::Value(format!(
                "metadata key {key:?} is not a lowercase ASCII header name (or ends in -bin)"
            ))
        })?;
        let value = AsciiMetadataValue::try_from(value.as_str()).map_err(|_| {
            Failure::Value(format!(
                "metadata value {value:?} of {key:?} is not printable ASCII"
            ))
        })?;
        request.metadata_mut().append(name, value);
    }
    if let Some(timeout) = timeout {
        request.set_timeout(timeout);
    }
    Ok(request)
}

fn method_path(method: &str) -> Result<http::uri::PathAndQuery, Failure> {
    if !method.starts_with('/') {
        return Err(Failure::Value(format!(
            "method must be a path like \"/pkg.Service/Method\", got {method:?}"
        )));
    }
    http::uri::PathAndQuery::try_from(method).map_err(|_| {
        Failure::Value(format!(
            "method must be a path like \"/pkg.Service/Method\", got {method:?}"
        ))
    })
}

/// A connected HTTP/2 channel to `"host:port"` or `"unix:///abs/path"`.
#[pyclass(module = "rlmesh._core", frozen)]
pub struct WireChannel {
    core: Arc<ChannelCore>,
}

#[pymethods]
impl WireChannel {
    #[new]
    #[pyo3(signature = (target, *, max_message_bytes, connect_timeout))]
    fn new(
        py: Python<'_>,
        target: &str,
        max_message_bytes: usize,
        connect_timeout: f64,
    ) -> PyResult<Self> {
        let timeout = seconds(Some(connect_timeout), "connect_timeout")?.unwrap_or_default();
        if max_message_bytes == 0 {
            return Err(PyValueError::new_err(
                "max_message_bytes must be positive, got 0",
            ));
        }
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|err| {
                PyOSError::new_err(format!("cannot start the channel's runtime: {err}"))
            })?;
        let parsed = Target::parse(target);
        let connected = py.detach(|| runtime.block_on(connect(&parsed, timeout)));
        let channel = connected.map_err(|reason| {
            status_error(
                py,
                "UNAVAILABLE",
                &format!("no server answered at {target} within {connect_timeout} s: {reason}"),
            )
        })?;
        let core = ChannelCore {
            target: target.to_owned(),
            runtime,
            max_message_bytes,
            channel: Mutex::new(Some(channel)),
            streams: Mutex::new(Vec::new()),
        };
        Ok(WireChannel {
            core: Arc::new(core),
        })
    }

    /// Call `method` ("/pkg.Service/Method") with one message and return its one answer.
    #[pyo3(signature = (method, request, *, metadata = Vec::new(), timeout = None))]
    fn unary<'py>(
        &self,
        py: Python<'py>,
        method: &str,
        request: &[u8],
        metadata: Vec<(String, String)>,
        timeout: Option<f64>,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let limit = seconds(timeout, "timeout")?;
        let message = Bytes::copy_from_slice(request);
        let core = &self.core;
        let answer = py.detach(|| -> Result<Bytes, Failure> {
            let path = method_path(method)?;
            let request = request_with(message, &metadata, limit)?;
            let mut client = core.client(core.channel()?);
            let call = async move {
                client
                    .ready()
                    .await
                    .map_err(|err| Status::unavailable(describe(&err)))?;
                client.unary(request, path, RawCodec).await
            };
            let outcome = core.runtime.block_on(async move {
                match limit {
                    Some(limit) => tokio::time::timeout(limit, call).await.ok(),
                    None => Some(call.await),
                }
            });
            if !matches!(outcome, Some(Ok(_))) {
                core.flush(); // a call given up on resets its stream: let that reach the server
            }
            match outcome {
                Some(Ok(response)) => Ok(response.into_inner()),
                // tonic reports its own expiry of grpc-timeout as CANCELLED
                Some(Err(status))
                    if limit.is_some()
                        && status.code() == Code::Cancelled
                        && status.message().contains("Timeout expired") =>
                {
                    Err(Failure::status(
                        "DEADLINE_EXCEEDED",
                        "the call's deadline passed",
                    ))
                }
                Some(Err(status)) => Err(Failure::of(&status)),
                None => Err(Failure::status(
                    "DEADLINE_EXCEEDED",
                    "the call's deadline passed",
                )),
            }
        });
        match answer {
            Ok(bytes) => Ok(PyBytes::new(py, &bytes)),
            Err(failure) => Err(failure.into_err(py)),
        }
    }

    /// Open a bidirectional stream on `method`.
    #[pyo3(signature = (method, *, metadata = Vec::new()))]
    fn stream(
        &self,
        py: Python<'_>,
        method: &str,
        metadata: Vec<(String, String)>,
    ) -> PyResult<WireStream> {
        let core = &self.core;
        let opened = (|| -> Result<Arc<StreamCore>, Failure> {
            let path = method_path(method)?;
            let (sender, receiver) = mpsc::unbounded_channel::<Bytes>();
            let mut request =
                request_with(UnboundedReceiverStream::new(receiver), &metadata, None)?;
            let cancel = request.cancellation_handle();
            let mut client = core.client(core.channel()?);
            // runs whenever the runtime is next driven (the first receive, or another call)
            let start = core.runtime.spawn(async move {
                client
                    .ready()
                    .await
                    .map_err(|err| Status::unavailable(describe(&err)))?;
                Ok(client
                    .streaming(request, path, RawCodec)
                    .await?
                    .into_inner())
            });
            let stream = Arc::new(StreamCore {
                sender: Mutex::new(Some(sender)),
                cancel: Mutex::new(Some(cancel)),
                phase: Mutex::new(Phase::Starting(start)),
                cancelled: AtomicBool::new(false),
                long_waits: LongWaits::default(),
            });
            let mut streams = lock(&core.streams);
            streams.retain(|open| open.strong_count() > 0);
            streams.push(Arc::downgrade(&stream));
            Ok(stream)
        })();
        match opened {
            Ok(stream) => Ok(WireStream {
                channel: core.clone(),
                core: stream,
            }),
            Err(failure) => Err(failure.into_err(py)),
        }
    }

    /// Close the channel; its open streams end (their receive raises CANCELLED). Idempotent.
    fn close(&self, py: Python<'_>) {
        let core = &self.core;
        py.detach(|| {
            let streams = std::mem::take(&mut *lock(&core.streams));
            for stream in streams.iter().filter_map(Weak::upgrade) {
                stream.cancel();
            }
            let channel = lock(&core.channel).take();
            drop(channel);
            core.flush();
        });
    }

    fn __repr__(&self) -> String {
        let state = if lock(&self.core.channel).is_some() {
            "open"
        } else {
            "closed"
        };
        format!("WireChannel({}, {state})", self.core.target)
    }
}

type Started = tokio::task::JoinHandle<Result<Streaming<Bytes>, Status>>;

/// Where a client stream is: its call on the way out, open, or finished (None: with OK).
enum Phase {
    Starting(Started),
    Open(Streaming<Bytes>),
    Finished(Option<Failure>),
}

struct StreamCore {
    sender: Mutex<Option<mpsc::UnboundedSender<Bytes>>>,
    cancel: Mutex<Option<CancellationHandle>>,
    phase: Mutex<Phase>,
    cancelled: AtomicBool,
    long_waits: LongWaits,
}

impl StreamCore {
    /// End the call now: its request body fails (RST_STREAM) and its response is dropped.
    fn cancel(&self) {
        self.cancelled.store(true, Ordering::SeqCst);
        if let Some(handle) = lock(&self.cancel).take() {
            handle.cancel();
        }
        lock(&self.sender).take();
        // a receive in another thread holds the phase: it sees the cancel when it wakes
        if let Ok(mut phase) = self.phase.try_lock() {
            if let Phase::Starting(start) = &*phase {
                start.abort();
            }
            *phase = Phase::Finished(Some(cancelled()));
        }
    }

    fn finished(&self) -> Option<Failure> {
        if self.cancelled.load(Ordering::SeqCst) {
            return Some(cancelled());
        }
        match &*self.phase.try_lock().ok()? {
            Phase::Finished(Some(failure)) => Some(failure.clone()),
            Phase::Finished(None) => Some(Failure::status(
                "FAILED_PRECONDITION",
                "the stream has finished",
            )),
            _ => None,
        }
    }
}

/// How many of a waiter's waits in a row lasted longer than `POLL` (0 before the first).
#[derive(Default)]
struct LongWaits(AtomicU32);

/// A waiter in a run of long waits still polls at every `PROBE_EVERY`th of them, so it sees
/// when its messages come quickly again even if parking alone kept its waits long. The first
/// probe comes late: earlier ones cost a served env with slow steps 8-10% (BENCHMARKS.md),
/// likely because its quick resets end a run every few rounds.
const PROBE_EVERY: u32 = 64;

impl LongWaits {
    /// Whether to poll: the previous wait was short (polling would have caught its message),
    /// or it is time to probe.
    fn poll_next(&self) -> bool {
        self.0.load(Ordering::Relaxed) % PROBE_EVERY == 0
    }

    fn record(&self, started: Instant) {
        let streak = self.0.load(Ordering::Relaxed);
        let next = if started.elapsed() < POLL {
            0
        } else {
            streak.wrapping_add(1)
        };
        self.0.store(next, Ordering::Relaxed);
    }
}

/// `future`'s output, polling it for up to `POLL` before awaiting it when `long_waits` says
/// so: between polls the runtime polls its sockets without blocking, and the thread yields
/// its CPU. Records this wait in `long_waits`.
async fn polled<T>(future: impl Future<Output = T>, long_waits: &LongWaits) -> T {
    let started = Instant::now();
    let mut future = std::pin::pin!(future);
    let output = 'wait: {
        if long_waits.poll_next() {
            let until = started + POLL;
            while Instant::now() < until {
                tokio::select! {
                    biased;
                    output = &mut future => break 'wait output,
                    _ = tokio::task::yield_now() => std::thread::yield_now(),
                }
            }
        }
        future.await
    };
    long_waits.record(started);
    output
}

/// Counts a waiting `receive` in `RECEIVING` while it lives.
struct Receiving;

impl Receiving {
    /// Count one more waiting `receive`; whether it is the only one.
    fn start() -> (Self, bool) {
        let others = RECEIVING.fetch_add(1, Ordering::SeqCst);
        (Receiving, others == 0)
    }
}

impl Drop for Receiving {
    fn drop(&mut self) {
        RECEIVING.fetch_sub(1, Ordering::SeqCst);
    }
}

async fn next_message(phase: &mut Phase, cancelled: &AtomicBool) -> Result<Option<Bytes>, Failure> {
    loop {
        if cancelled.load(Ordering::SeqCst) && !matches!(phase, Phase::Finished(_)) {
            *phase = Phase::Finished(Some(self::cancelled()));
        }
        match phase {
            Phase::Starting(start) => {
                *phase = match start.await {
                    Ok(Ok(stream)) => Phase::Open(stream),
                    Ok(Err(status)) => Phase::Finished(Some(Failure::of(&status))),
                    Err(err) => {
                        Phase::Finished(Some(Failure::status("CANCELLED", err.to_string())))
                    }
                };
            }
            Phase::Open(stream) => match stream.message().await {
                Ok(Some(message)) => return Ok(Some(message)),
                Ok(None) => *phase = Phase::Finished(None),
                Err(status) => {
                    let failure = if cancelled.load(Ordering::SeqCst) {
                        self::cancelled()
                    } else {
                        Failure::of(&status)
                    };
                    *phase = Phase::Finished(Some(failure));
                }
            },
            Phase::Finished(None) => return Ok(None),
            Phase::Finished(Some(failure)) => return Err(failure.clone()),
        }
    }
}

/// One bidirectional call, made by `WireChannel.stream`.
#[pyclass(module = "rlmesh._core", frozen)]
pub struct WireStream {
    channel: Arc<ChannelCore>,
    core: Arc<StreamCore>,
}

#[pymethods]
impl WireStream {
    /// Queue `message` (written when the runtime is next driven); WireStatusError once the
    /// stream has finished.
    fn send(&self, py: Python<'_>, message: &[u8]) -> PyResult<()> {
        if let Some(failure) = self.core.finished() {
            return Err(failure.into_err(py));
        }
        let sender = lock(&self.core.sender);
        let Some(sender) = sender.as_ref() else {
            return Err(status_error(
                py,
                "FAILED_PRECONDITION",
                "send after close_send",
            ));
        };
        sender
            .send(Bytes::copy_from_slice(message))
            .map_err(|_| status_error(py, "FAILED_PRECONDITION", "the stream has finished"))
    }

    /// The next message; None once the server finished with OK; WireStatusError for another
    /// status or a broken connection; TimeoutError after `timeout` s (the stream stays usable).
    #[pyo3(signature = (timeout = None))]
    fn receive<'py>(
        &self,
        py: Python<'py>,
        timeout: Option<f64>,
    ) -> PyResult<Option<Bound<'py, PyBytes>>> {
        let limit = seconds(timeout, "timeout")?;
        let (channel, core) = (&self.channel, &self.core);
        let outcome = py.detach(|| {
            let mut phase = lock(&core.phase);
            let (_receiving, alone) = Receiving::start();
            channel.runtime.block_on(async {
                let next = async {
                    let next = next_message(&mut phase, &core.cancelled);
                    if alone {
                        polled(next, &core.long_waits).await
                    } else {
                        next.await
                    }
                };
                match limit {
                    Some(limit) => tokio::time::timeout(limit, next)
                        .await
                        .unwrap_or_else(|_| Err(Failure::Timeout(limit.as_secs_f64()))),
                    None => next.await,
                }
            })
        });
        match outcome {
            Ok(message) => Ok(message.map(|bytes| PyBytes::new(py, &bytes))),
            Err(failure) => Err(failure.into_err(py)),
        }
    }

    /// Half-close: the server's requests end; its answers may still come.
    fn close_send(&self, py: Python<'_>) {
        let (channel, core) = (&self.channel, &self.core);
        py.detach(|| {
            if lock(&core.sender).take().is_some() {
                channel.flush();
            }
        });
    }

    /// End the call now (the server sees it cancelled); a later receive raises CANCELLED.
    fn cancel(&self, py: Python<'_>) {
        let (channel, core) = (&self.channel, &self.core);
        py.detach(|| {
            core.cancel();
            channel.flush();
        });
    }
}

impl Drop for WireStream {
    /// A stream dropped unfinished is cancelled, so the server's call ends too (as grpcio
    /// cancels a call it garbage-collects).
    fn drop(&mut self) {
        if self.core.finished().is_none() {
            self.core.cancel();
            self.channel.flush();
        }
    }
}

// ------------------------------------------------------------------------------ the server

/// One server call's state, shared by its HTTP/2 side and its Python thread.
struct CallCore {
    active: AtomicBool,
    /// Set when the call must end now with `stop`'s status (cancelled, or a request refused).
    stopped: AtomicBool,
    stop: Mutex<Option<Status>>,
    waker: Mutex<Option<Waker>>,
    ended: watch::Sender<bool>,
    deadline: Option<Instant>,
    status: Mutex<(i32, String)>,
}

impl CallCore {
    fn end(&self) {
        self.active.store(false, Ordering::SeqCst);
        self.ended.send_replace(true);
    }

    /// End the call now with `status`: its responses end with it, its requests stop.
    fn stop_with(&self, status: Status) {
        if self.stopped.load(Ordering::SeqCst) {
            return;
        }
        *lock(&self.stop) = Some(status);
        self.stopped.store(true, Ordering::SeqCst);
        self.end();
        if let Some(waker) = lock(&self.waker).take() {
            waker.wake();
        }
    }
}

/// The response stream tonic sends: what the call's Python thread queues, ended early by a stop.
struct Responses {
    messages: mpsc::Receiver<Result<Bytes, Status>>,
    call: Arc<CallCore>,
    shared: Arc<ServerShared>,
}

impl Stream for Responses {
    type Item = Result<Bytes, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.call.stopped.load(Ordering::SeqCst) {
            return Poll::Ready(lock(&self.call.stop).take().map(Err));
        }
        {
            let mut waker = lock(&self.call.waker);
            if !waker
                .as_ref()
                .is_some_and(|known| known.will_wake(cx.waker()))
            {
                *waker = Some(cx.waker().clone());
            }
        }
        if self.call.stopped.load(Ordering::SeqCst) {
            cx.waker().wake_by_ref(); // stopped while the waker was being stored
            return Poll::Pending;
        }
        self.messages.poll_recv(cx)
    }
}

impl Drop for Responses {
    fn drop(&mut self) {
        self.call.end(); // finished, or the client reset the stream or went away
        self.shared.open.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Hands a call's incoming messages to its Python thread until they end or the call does;
/// polls for each (`POLL`) while the call is the server's only open one.
async fn forward(
    mut incoming: Streaming<Bytes>,
    requests: mpsc::Sender<Bytes>,
    call: Arc<CallCore>,
    shared: Arc<ServerShared>,
) {
    let mut ended = call.ended.subscribe();
    let long_waits = LongWaits::default();
    loop {
        let next = async {
            tokio::select! {
                _ = ended.wait_for(|ended| *ended) => None,
                message = incoming.message() => Some(message),
            }
        };
        let next = if shared.open_calls() <= 1 {
            polled(next, &long_waits).await
        } else {
            next.await
        };
        let Some(message) = next else { return };
        match message {
            Ok(Some(message)) => {
                tokio::select! {
                    _ = ended.wait_for(|ended| *ended) => return,
                    sent = requests.send(message) => if sent.is_err() { return },
                }
            }
            Ok(None) => return,
            // a refused message (too large) ends the call with its status; a reset one ends it
            Err(status) => return call.stop_with(oversize_as_exhausted(&status)),
        }
    }
}

/// Ends a call still running at its deadline with DEADLINE_EXCEEDED, as gRPC servers do.
async fn expire(call: Arc<CallCore>, deadline: Instant) {
    let mut ended = call.ended.subscribe();
    tokio::select! {
        _ = ended.wait_for(|ended| *ended) => {}
        _ = tokio::time::sleep_until(deadline.into()) => {
            call.stop_with(Status::deadline_exceeded("the call's deadline passed"));
        }
    }
}

/// `grpc-timeout`: at most 8 digits and a unit (H, M, S, m, u, n).
fn parse_grpc_timeout(value: &str) -> Option<Duration> {
    let (digits, unit) = value.split_at(value.len().checked_sub(1)?);
    if digits.is_empty() || digits.len() > 8 {
        return None;
    }
    let amount: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(amount * 3600),
        "M" => Duration::from_secs(amount * 60),
        "S" => Duration::from_secs(amount),
        "m" => Duration::from_millis(amount),
        "u" => Duration::from_micros(amount),
        "n" => Duration::from_nanos(amount),
        _ => return None,
    })
}

struct ServerShared {
    dispatch: Mutex<Option<Py<PyAny>>>,
    max_message_bytes: usize,
    calls: Mutex<Vec<Weak<CallCore>>>,
    threads: Mutex<Vec<std::thread::JoinHandle<()>>>,
    /// Calls whose response stream tonic still holds.
    open: AtomicUsize,
}

impl ServerShared {
    fn open_calls(&self) -> usize {
        self.open.load(Ordering::SeqCst)
    }

    /// Wait (polling, bounded by `deadline`) until no call is open.
    fn wait_for_calls(&self, deadline: Instant) {
        while self.open_calls() > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

/// The tower service for every path: each request becomes a streaming gRPC call.
#[derive(Clone)]
struct Calls {
    shared: Arc<ServerShared>,
}

type Answer =
    Pin<Box<dyn Future<Output = Result<http::Response<tonic::body::Body>, Infallible>> + Send>>;

impl tower::Service<http::Request<tonic::body::Body>> for Calls {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = Answer;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Answer {
        let handler = CallHandler {
            method: request.uri().path().to_owned(),
            shared: self.shared.clone(),
        };
        let limit = self.shared.max_message_bytes;
        Box::pin(async move {
            let mut grpc = tonic::server::Grpc::new(RawCodec)
                .max_decoding_message_size(limit)
                .max_encoding_message_size(limit);
            Ok(grpc.streaming(handler, request).await)
        })
    }
}

struct CallHandler {
    method: String,
    shared: Arc<ServerShared>,
}

impl tower::Service<Request<Streaming<Bytes>>> for CallHandler {
    type Response = tonic::Response<Responses>;
    type Error = Status;
    type Future = std::future::Ready<Result<Self::Response, Status>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Status>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Streaming<Bytes>>) -> Self::Future {
        std::future::ready(self.start(request))
    }
}

impl CallHandler {
    /// Start the call's Python thread and return its response stream at once, so the
    /// response headers go out now (tonic clients wait for them before their first message).
    fn start(
        &self,
        request: Request<Streaming<Bytes>>,
    ) -> Result<tonic::Response<Responses>, Status> {
        let (metadata, _, incoming) = request.into_parts();
        let headers = metadata.into_headers();
        let deadline = headers
            .get("grpc-timeout")
            .and_then(|value| value.to_str().ok())
            .and_then(parse_grpc_timeout)
            .map(|timeout| Instant::now() + timeout);
        let pairs: Vec<(String, String)> = headers
            .iter()
            .filter(|(name, _)| {
                let name = name.as_str();
                !RESERVED_HEADERS.contains(&name) && !name.starts_with("grpc-")
            })
            .map(|(name, value)| {
                (
                    name.as_str().to_owned(),
                    String::from_utf8_lossy(value.as_bytes()).into_owned(),
                )
            })
            .collect();
        let call = Arc::new(CallCore {
            active: AtomicBool::new(true),
            stopped: AtomicBool::new(false),
            stop: Mutex::new(None),
            waker: Mutex::new(None),
            ended: watch::Sender::new(false),
            deadline,
            status: Mutex::new((0, String::new())),
        });
        let (request_sender, request_receiver) = mpsc::channel(CALL_QUEUE);
        let (response_sender, response_receiver) = mpsc::channel(CALL_QUEUE);
        tokio::spawn(forward(
            incoming,
            request_sender,
            call.clone(),
            self.shared.clone(),
        ));
        if let Some(deadline) = deadline {
            tokio::spawn(expire(call.clone(), deadline));
        }
        let (shared, method, thread_call) =
            (self.shared.clone(), self.method.clone(), call.clone());
        let thread = std::thread::Builder::new()
            .name("rlmesh-wire-call".into())
            .spawn(move || {
                Python::attach(|py| {
                    serve_call(
                        py,
                        &shared,
                        method,
                        pairs,
                        request_receiver,
                        response_sender,
                        thread_call,
                    )
                })
            })
            .map_err(|err| {
                Status::resource_exhausted(format!("cannot start the call's thread: {err}"))
            })?;
        {
            let mut calls = lock(&self.shared.calls);
            calls.retain(|open| open.strong_count() > 0);
            calls.push(Arc::downgrade(&call));
        }
        {
            let mut threads = lock(&self.shared.threads);
            threads.retain(|running| !running.is_finished());
            threads.push(thread);
        }
        self.shared.open.fetch_add(1, Ordering::SeqCst);
        let responses = Responses {
            messages: response_receiver,
            call,
            shared: self.shared.clone(),
        };
        Ok(tonic::Response::new(responses))
    }
}

/// A call's Python side: `dispatch(method, metadata, requests, call)`, each response queued
/// for tonic (the GIL released while it waits), then the status the call ends with.
fn serve_call(
    py: Python<'_>,
    shared: &Arc<ServerShared>,
    method: String,
    metadata: Vec<(String, String)>,
    requests: mpsc::Receiver<Bytes>,
    responses: mpsc::Sender<Result<Bytes, Status>>,
    call: Arc<CallCore>,
) {
    let dispatch = lock(&shared.dispatch)
        .as_ref()
        .map(|dispatch| dispatch.clone_ref(py));
    let Some(dispatch) = dispatch else {
        return call.stop_with(Status::unavailable("the server is closing"));
    };
    let requests = ServerRequests {
        messages: Mutex::new(requests),
        call: call.clone(),
    };
    let outcome = run_dispatch(py, &dispatch, method, metadata, requests, &responses, &call);
    let status = match outcome {
        Ok(()) => {
            let (code, details) = lock(&call.status).clone();
            (code != 0).then(|| Status::new(Code::from(code), details))
        }
        Err(err) => {
            let name = err
                .get_type(py)
                .name()
                .map(|name| name.to_string())
                .unwrap_or_else(|_| "Exception".to_owned());
            Some(Status::unknown(format!("{name}: {}", err.value(py))))
        }
    };
    if let Some(status) = status {
        let _ = py.detach(|| responses.blocking_send(Err(status)));
    }
    drop(responses);
    call.active.store(false, Ordering::SeqCst);
}

fn run_dispatch(
    py: Python<'_>,
    dispatch: &Py<PyAny>,
    method: String,
    metadata: Vec<(String, String)>,
    requests: ServerRequests,
    responses: &mpsc::Sender<Result<Bytes, Status>>,
    call: &Arc<CallCore>,
) -> PyResult<()> {
    let requests = Py::new(py, requests)?;
    let handle = Py::new(py, ServerCall { call: call.clone() })?;
    let pairs = metadata
        .iter()
        .map(|(key, value)| PyTuple::new(py, [key, value]))
        .collect::<PyResult<Vec<_>>>()?;
    let metadata = PyList::new(py, pairs)?;
    let answers = dispatch
        .bind(py)
        .call1((method, metadata, requests, handle))?;
    for answer in answers.try_iter()? {
        let answer = answer?;
        let message = answer.extract::<PyBackedBytes>().map_err(|_| {
            PyTypeError::new_err(format!(
                "dispatch must yield bytes, got {}",
                answer
                    .get_type()
                    .name()
                    .map(|name| name.to_string())
                    .unwrap_or_default()
            ))
        })?;
        let message = Bytes::copy_from_slice(&message);
        if py.detach(|| responses.blocking_send(Ok(message))).is_err() {
            break; // the call is over: nobody reads the rest
        }
    }
    Ok(())
}

/// The incoming messages (bytes) of one server call.
#[pyclass(module = "rlmesh._core", frozen)]
pub struct ServerRequests {
    messages: Mutex<mpsc::Receiver<Bytes>>,
    call: Arc<CallCore>,
}

#[pymethods]
impl ServerRequests {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    /// The next message, waited for with the GIL released (parked: the HTTP/2 side polls, see
    /// `POLL`); the iteration ends when the client half-closed, cancelled or went away, or the
    /// server closed.
    fn __next__<'py>(&self, py: Python<'py>) -> Option<Bound<'py, PyBytes>> {
        if !self.call.active.load(Ordering::SeqCst) {
            return None;
        }
        let message = py.detach(|| lock(&self.messages).blocking_recv());
        message.map(|bytes| PyBytes::new(py, &bytes))
    }
}

/// One incoming call's controls.
#[pyclass(module = "rlmesh._core", frozen)]
pub struct ServerCall {
    call: Arc<CallCore>,
}

#[pymethods]
impl ServerCall {
    /// Send the response headers now: tonic sends them when the call arrives already.
    fn send_headers(&self) {}

    /// The status (gRPC code 0..16) the call ends with once its responses end.
    fn set_status(&self, code: i64, details: String) -> PyResult<()> {
        if !(0..=16).contains(&code) {
            return Err(PyValueError::new_err(format!(
                "set_status: code must be a gRPC status code 0..16, got {code}"
            )));
        }
        *lock(&self.call.status) = (code as i32, details);
        Ok(())
    }

    /// End the call now: the client sees CANCELLED; the requests stop.
    fn cancel(&self) {
        self.call
            .stop_with(Status::cancelled("the server cancelled the call"));
    }

    /// False once the client cancelled or went away, or the call ended.
    fn is_active(&self) -> bool {
        self.call.active.load(Ordering::SeqCst)
    }

    /// Seconds left before the client's deadline (grpc-timeout), None without one.
    fn time_remaining(&self) -> Option<f64> {
        self.call.deadline.map(|deadline| {
            deadline
                .saturating_duration_since(Instant::now())
                .as_secs_f64()
        })
    }
}

/// What a running server holds until it closes.
struct Serving {
    runtime: Runtime,
    shutdown: oneshot::Sender<()>,
    socket: Option<PathBuf>,
}

/// A gRPC server for any method path: every call runs `dispatch` on a thread of its own.
#[pyclass(module = "rlmesh._core", frozen)]
pub struct WireServer {
    /// The bound TCP port (the one picked for port 0); 0 on a unix socket.
    #[pyo3(get)]
    port: u16,
    target: String,
    shared: Arc<ServerShared>,
    serving: Mutex<Option<Serving>>,
}

async fn serve_tcp(
    calls: Calls,
    listener: tokio::net::TcpListener,
    shutdown: oneshot::Receiver<()>,
) {
    let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
    let signal = async {
        let _ = shutdown.await;
    };
    let _ = tonic::transport::Server::builder()
        .serve_with_incoming_shutdown(calls, incoming, signal)
        .await;
}

async fn serve_unix(
    calls: Calls,
    listener: tokio::net::UnixListener,
    shutdown: oneshot::Receiver<()>,
) {
    let incoming = UnixListenerStream::new(listener);
    let signal = async {
        let _ = shutdown.await;
    };
    let _ = tonic::transport::Server::builder()
        .serve_with_incoming_shutdown(calls, incoming, signal)
        .await;
}

/// Unlink a unix socket left at `path` by a server that is gone (as grpcio does).
fn remove_socket(path: &std::path::Path) {
    use std::os::unix::fs::FileTypeExt;
    if std::fs::symlink_metadata(path).is_ok_and(|meta| meta.file_type().is_socket()) {
        let _ = std::fs::remove_file(path);
    }
}

#[pymethods]
impl WireServer {
    #[new]
    #[pyo3(signature = (target, dispatch, *, max_message_bytes))]
    fn new(
        py: Python<'_>,
        target: &str,
        dispatch: Py<PyAny>,
        max_message_bytes: usize,
    ) -> PyResult<Self> {
        if !dispatch.bind(py).is_callable() {
            return Err(PyTypeError::new_err(
                "dispatch must be callable as dispatch(method, metadata, requests, call)",
            ));
        }
        if max_message_bytes == 0 {
            return Err(PyValueError::new_err(
                "max_message_bytes must be positive, got 0",
            ));
        }
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("rlmesh-wire-io")
            .enable_all()
            .build()
            .map_err(|err| {
                PyOSError::new_err(format!("cannot start the server's runtime: {err}"))
            })?;
        let shared = Arc::new(ServerShared {
            dispatch: Mutex::new(Some(dispatch)),
            max_message_bytes,
            calls: Mutex::new(Vec::new()),
            threads: Mutex::new(Vec::new()),
            open: AtomicUsize::new(0),
        });
        let calls = Calls {
            shared: shared.clone(),
        };
        let (shutdown, shutdown_receiver) = oneshot::channel();
        let parsed = Target::parse(target);
        let bound = py.detach(|| {
            runtime.block_on(async {
                match parsed {
                    Target::Tcp(address) => {
                        let listener = tokio::net::TcpListener::bind(&address).await?;
                        let port = listener.local_addr()?.port();
                        tokio::spawn(serve_tcp(calls, listener, shutdown_receiver));
                        Ok::<_, std::io::Error>((port, None))
                    }
                    Target::Unix(path) => {
                        remove_socket(&path);
                        let listener = tokio::net::UnixListener::bind(&path)?;
                        tokio::spawn(serve_unix(calls, listener, shutdown_receiver));
                        Ok((0, Some(path)))
                    }
                }
            })
        });
        let (port, socket) =
            bound.map_err(|err| PyOSError::new_err(format!("cannot listen on {target}: {err}")))?;
        let serving = Serving {
            runtime,
            shutdown,
            socket,
        };
        Ok(WireServer {
            port,
            target: target.to_owned(),
            shared,
            serving: Mutex::new(Some(serving)),
        })
    }

    /// Stop accepting; open calls get `grace` s, then are cancelled (their requests end). Returns
    /// once every call's thread is done. Idempotent.
    #[pyo3(signature = (grace = 1.0))]
    fn close(&self, py: Python<'_>, grace: f64) -> PyResult<()> {
        let grace = seconds(Some(grace), "grace")?.unwrap_or_default();
        let Some(serving) = lock(&self.serving).take() else {
            return Ok(());
        };
        let shared = &self.shared;
        py.detach(move || {
            let _ = serving.shutdown.send(()); // no new connections; open ones get GOAWAY
            shared.wait_for_calls(Instant::now() + grace);
            if shared.open_calls() > 0 {
                let calls = std::mem::take(&mut *lock(&shared.calls));
                for call in calls.iter().filter_map(Weak::upgrade) {
                    call.stop_with(Status::cancelled("the server is closing"));
                }
                // their trailers go out as their response streams end
                shared.wait_for_calls(Instant::now() + Duration::from_secs(1));
                std::thread::sleep(Duration::from_millis(10));
            }
            let threads = std::mem::take(&mut *lock(&shared.threads));
            let current = std::thread::current().id();
            // a call may close its own server (a Shutdown method): it cannot wait for itself
            for thread in threads
                .into_iter()
                .filter(|thread| thread.thread().id() != current)
            {
                let _ = thread.join();
            }
            serving.runtime.shutdown_timeout(Duration::from_millis(200));
            if let Some(path) = &serving.socket {
                remove_socket(path);
            }
        });
        let dispatch = lock(&self.shared.dispatch).take();
        drop(dispatch);
        Ok(())
    }

    fn __repr__(&self) -> String {
        let state = if lock(&self.serving).is_some() {
            "serving"
        } else {
            "closed"
        };
        format!("WireServer({}, port={}, {state})", self.target, self.port)
    }
}

/// The transport's classes, added to the `_core` module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("WireStatusError", m.py().get_type::<WireStatusError>())?;
    m.add_class::<WireChannel>()?;
    m.add_class::<WireStream>()?;
    m.add_class::<WireServer>()?;
    m.add_class::<ServerRequests>()?;
    m.add_class::<ServerCall>()?;
    Ok(())
}
