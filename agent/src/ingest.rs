//! Where events come in: DogStatsD datagrams (UDP or a Unix datagram socket) and the gRPC
//! `Ingest` service. Both add whole batches under one hold of the table's lock and count
//! what they refused by reason; bad input is logged at a bounded rate and never stops the
//! agent.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hourglass_rpc::packed;
use hourglass_rpc::proto::v1;
use tonic::{Request, Response, Status};

use crate::config::Config;
use crate::metrics::Metrics;
use crate::statsd::{self, Parsed};
use crate::table::{IngestStats, Table};
use hourglass_rpc::time::unix_now;

#[cfg(test)]
mod packed_tests;
#[cfg(test)]
mod run_tests;
#[cfg(test)]
mod stopping_tests;
#[cfg(test)]
mod testing;

/// Logs at most `per_window` messages per window and then one line saying how many it
/// held back, so a flood of bad input cannot flood the log.
pub(crate) struct LogLimiter {
    window: Duration,
    per_window: u32,
    started: Instant,
    logged: u32,
    suppressed: u64,
}

impl LogLimiter {
    /// At most `per_window` lines per `window`.
    pub fn new(window: Duration, per_window: u32) -> LogLimiter {
        LogLimiter {
            window,
            per_window,
            started: Instant::now(),
            logged: 0,
            suppressed: 0,
        }
    }

    /// Whether to log one more line now.
    pub fn allow(&mut self) -> bool {
        if self.started.elapsed() >= self.window {
            if self.suppressed > 0 {
                tracing::warn!(
                    suppressed = self.suppressed,
                    "more bad input was not logged (see the rejected counters)"
                );
            }
            self.started = Instant::now();
            self.logged = 0;
            self.suppressed = 0;
        }
        if self.logged < self.per_window {
            self.logged += 1;
            true
        } else {
            self.suppressed += 1;
            false
        }
    }
}

/// Adds the lines of DogStatsD datagrams to the table.
pub struct StatsdHandler {
    table: Arc<Mutex<Table>>,
    metrics: Arc<Metrics>,
    log: LogLimiter,
}

impl StatsdHandler {
    /// A handler adding to `table`.
    pub fn new(table: Arc<Mutex<Table>>, metrics: Arc<Metrics>) -> StatsdHandler {
        StatsdHandler {
            table,
            metrics,
            log: LogLimiter::new(Duration::from_secs(10), 10),
        }
    }

    /// Adds every line of `datagrams`, under one hold of the lock.
    pub fn handle<'a>(&mut self, datagrams: impl Iterator<Item = &'a [u8]>) {
        let now = unix_now();
        let mut stats = IngestStats::default();
        let mut unsupported = 0u64;
        let mut count = 0u64;
        {
            let mut table = crate::table::lock(&self.table);
            for datagram in datagrams {
                count += 1;
                for line in statsd::lines(datagram) {
                    let reason = match statsd::parse_line(line) {
                        Ok(Parsed::Set(set)) => {
                            // The tag section was checked to be UTF-8 by the parser.
                            let tags = std::str::from_utf8(set.tags).unwrap_or_default();
                            let added = table
                                .check(set.item, set.timestamp.unwrap_or(now), now)
                                .and_then(|hour| {
                                    let id = table.resolve_statsd(set.metric, tags, &mut stats)?;
                                    table.insert_at(id, hour, set.item, 1);
                                    Ok(())
                                });
                            match added {
                                Ok(()) => {
                                    stats.accepted += 1;
                                    continue;
                                }
                                Err(e) => {
                                    if self.log.allow() {
                                        tracing::warn!(line = %String::from_utf8_lossy(line), error = %e, "statsd line rejected");
                                    }
                                    e.reason()
                                }
                            }
                        }
                        Ok(Parsed::Unsupported) => {
                            unsupported += 1;
                            continue;
                        }
                        Err(e) => {
                            if self.log.allow() {
                                tracing::warn!(line = %String::from_utf8_lossy(line), error = %e, "malformed statsd line");
                            }
                            e.reason()
                        }
                    };
                    stats.reject(reason);
                }
            }
        }
        self.metrics.datagrams.inc_by(count);
        self.metrics.unsupported.inc_by(unsupported);
        self.metrics.ingested("statsd", &stats);
    }
}

/// Datagrams received per system call at most.
pub(crate) const DATAGRAMS_PER_CALL: usize = 32;
/// The largest datagram: the UDP payload limit.
pub(crate) const MAX_DATAGRAM: usize = 65_536;
/// The length recorded for a datagram that did not fit its buffer.
const TRUNCATED: usize = usize::MAX;
/// Receive buffer asked of the kernel, so bursts wait in the socket rather than drop.
pub(crate) const RECEIVE_BUFFER: usize = 16 << 20;

/// A datagram socket the receiver reads: UDP or Unix.
pub(crate) trait DatagramSocket: std::os::fd::AsFd + Send + 'static {}

impl DatagramSocket for std::net::UdpSocket {}

impl DatagramSocket for std::os::unix::net::UnixDatagram {}

/// How long one receive waits for a first datagram, so the thread sees `stop` in time.
const RECEIVE_TIMEOUT: Duration = Duration::from_millis(200);

/// Asks for a large receive buffer (forcing past `rmem_max` when privileged) and a read
/// timeout, so the receiving thread sees `stop` in time; returns the buffer granted.
pub(crate) fn prepare_socket(socket: &impl DatagramSocket) -> std::io::Result<usize> {
    use rustix::net::sockopt;
    // SO_RCVBUFFORCE needs CAP_NET_ADMIN; without it, SO_RCVBUF (capped at rmem_max).
    if sockopt::set_socket_recv_buffer_size_force(socket, RECEIVE_BUFFER).is_err() {
        sockopt::set_socket_recv_buffer_size(socket, RECEIVE_BUFFER)?;
    }
    sockopt::set_socket_timeout(socket, sockopt::Timeout::Recv, Some(RECEIVE_TIMEOUT))?;
    Ok(sockopt::socket_recv_buffer_size(socket)?)
}

/// Receives datagrams on `socket` until `stop`, up to [`DATAGRAMS_PER_CALL`] per
/// `recvmmsg` call, and hands each burst to `handler`. Runs on its own thread.
pub(crate) fn receive_loop(
    socket: impl DatagramSocket,
    mut handler: StatsdHandler,
    stop: Arc<AtomicBool>,
) {
    let fd = std::os::fd::AsRawFd::as_raw_fd(&socket.as_fd());
    let mut buffers = vec![0u8; DATAGRAMS_PER_CALL * MAX_DATAGRAM];
    let mut lens = [0usize; DATAGRAMS_PER_CALL];
    let mut log = LogLimiter::new(Duration::from_secs(10), 3);
    while !stop.load(Ordering::Relaxed) {
        match recv_burst(fd, &mut buffers, &mut lens) {
            Ok(0) => {}
            Ok(n) => {
                let truncated = lens[..n].iter().filter(|&&len| len == TRUNCATED).count();
                if truncated > 0 {
                    handler
                        .metrics
                        .reject("statsd", "truncated_datagram", truncated as u64);
                }
                handler.handle(
                    lens[..n]
                        .iter()
                        .enumerate()
                        .filter(|(_, len)| **len != TRUNCATED)
                        .map(|(i, &len)| &buffers[i * MAX_DATAGRAM..i * MAX_DATAGRAM + len]),
                )
            }
            Err(e) => {
                if log.allow() {
                    tracing::warn!(error = %e, "receiving datagrams failed");
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
    drop(socket);
}

/// One `recvmmsg`: waits up to the socket's timeout for the first datagram, then takes
/// whatever else is queued. Returns how many arrived (0 on timeout).
#[allow(unsafe_code)] // recvmmsg(2): neither std nor rustix has it; see SAFETY
fn recv_burst(
    fd: std::os::fd::RawFd,
    buffers: &mut [u8],
    lens: &mut [usize; DATAGRAMS_PER_CALL],
) -> std::io::Result<usize> {
    // SAFETY: zeroed iovec/mmsghdr are valid "empty" values; every pointer set below
    // points into `buffers` or `iovecs`, which outlive the call, and each iovec covers
    // exactly its own MAX_DATAGRAM slice of `buffers`.
    unsafe {
        let mut iovecs: [libc::iovec; DATAGRAMS_PER_CALL] = std::mem::zeroed();
        let mut headers: [libc::mmsghdr; DATAGRAMS_PER_CALL] = std::mem::zeroed();
        for i in 0..DATAGRAMS_PER_CALL {
            iovecs[i].iov_base = buffers.as_mut_ptr().add(i * MAX_DATAGRAM).cast();
            iovecs[i].iov_len = MAX_DATAGRAM;
            headers[i].msg_hdr.msg_iov = &mut iovecs[i];
            headers[i].msg_hdr.msg_iovlen = 1;
        }
        let n = libc::recvmmsg(
            fd,
            headers.as_mut_ptr(),
            DATAGRAMS_PER_CALL as libc::c_uint,
            libc::MSG_WAITFORONE,
            std::ptr::null_mut(),
        );
        if n < 0 {
            let e = std::io::Error::last_os_error();
            return match e.kind() {
                std::io::ErrorKind::WouldBlock
                | std::io::ErrorKind::TimedOut
                | std::io::ErrorKind::Interrupted => Ok(0),
                _ => Err(e),
            };
        }
        let n = n as usize;
        for i in 0..n {
            lens[i] = if headers[i].msg_hdr.msg_flags & libc::MSG_TRUNC != 0 {
                // Longer than the buffer: its last line would be cut, so none of it counts.
                TRUNCATED
            } else {
                (headers[i].msg_len as usize).min(MAX_DATAGRAM)
            };
        }
        Ok(n)
    }
}

/// The gRPC `Ingest` service.
pub(crate) struct IngestService {
    table: Arc<Mutex<Table>>,
    metrics: Arc<Metrics>,
    config: Arc<Config>,
    /// True while the agent takes events. Turned off under the table's lock once the gRPC
    /// server stopped ([`stop_taking`]): its drain is bounded, so a request may still be
    /// running, and it either adds its events before (the final flush takes them) or is
    /// refused, never acknowledged after the final flush and checkpoint.
    taking: Arc<AtomicBool>,
}

impl IngestService {
    /// A service adding to `table` while `taking` is true.
    pub fn new(
        table: Arc<Mutex<Table>>,
        metrics: Arc<Metrics>,
        config: Arc<Config>,
        taking: Arc<AtomicBool>,
    ) -> IngestService {
        IngestService {
            table,
            metrics,
            config,
            taking,
        }
    }
}

/// Stops the [`IngestService`]s of `table` taking events (`taking` off), under the
/// table's lock: every request that added events did so before this returns.
pub(crate) fn stop_taking(table: &Mutex<Table>, taking: &AtomicBool) {
    let _held = crate::table::lock(table);
    taking.store(false, Ordering::Release);
}

/// Rejected events listed in a reply at most.
const MAX_LISTED_REJECTS: usize = 100;

#[tonic::async_trait]
impl v1::ingest_server::Ingest for IngestService {
    async fn send(
        &self,
        request: Request<v1::IngestRequest>,
    ) -> Result<Response<v1::IngestResponse>, Status> {
        let request = request.into_inner();
        let lens: Vec<BatchLen> = request.batches.iter().map(BatchLen::of).collect();
        let count = request.events.len() + lens.iter().map(|l| l.events).sum::<usize>();
        let max = self.config.limits.max_events_per_request;
        if count > max {
            self.metrics
                .reject("ingest", "too_many_events", count as u64);
            return Err(Status::resource_exhausted(format!(
                "{count} events in one request, above limits.max_events_per_request = {max}"
            )));
        }
        let now = unix_now();
        let mut stats = IngestStats::default();
        let mut refusals = Refusals::default();
        {
            let mut table = crate::table::lock(&self.table);
            if !self.taking.load(Ordering::Acquire) {
                drop(table);
                self.metrics.reject("ingest", "stopping", count as u64);
                return Err(Status::unavailable(
                    "the agent is stopping: nothing of this request was taken; send it again once it runs",
                ));
            }
            add_events(&mut table, &request.events, now, &mut stats, &mut refusals);
            let mut index = request.events.len();
            for (batch, len) in request.batches.iter().zip(&lens) {
                add_batch(
                    &mut table,
                    batch,
                    len,
                    index,
                    now,
                    &mut stats,
                    &mut refusals,
                );
                index += len.events;
            }
        }
        self.metrics.ingested("ingest", &stats);
        Ok(Response::new(v1::IngestResponse {
            accepted: stats.accepted,
            rejected: stats.rejected_total(),
            rejected_events: refusals.listed,
        }))
    }
}

/// The events a request refused: counted by reason in the stats, the first
/// [`MAX_LISTED_REJECTS`] listed with their index for the reply.
#[derive(Default)]
struct Refusals {
    listed: Vec<v1::RejectedEvent>,
}

impl Refusals {
    fn refuse(&mut self, stats: &mut IngestStats, index: usize, why: String, reason: &'static str) {
        stats.reject(reason);
        if self.listed.len() < MAX_LISTED_REJECTS {
            self.listed.push(v1::RejectedEvent {
                index: index as u32,
                reason: why,
            });
        }
    }
}

/// The time of an event: its own, or `now` when it gives none (zero).
fn event_time(t: i64, now: i64) -> i64 {
    if t == 0 { now } else { t }
}

/// Adds single events (indexes from 0) to the table.
fn add_events(
    table: &mut Table,
    events: &[v1::Event],
    now: i64,
    stats: &mut IngestStats,
    refusals: &mut Refusals,
) {
    for (i, e) in events.iter().enumerate() {
        let added = table
            .check(&e.item, event_time(e.time_unix_seconds, now), now)
            .and_then(|hour| {
                let id = table.resolve_tags(&e.metric, &e.tags, stats)?;
                table.insert_at(id, hour, &e.item, e.weight);
                Ok(())
            });
        match added {
            Ok(()) => stats.accepted += 1,
            Err(reject) => refusals.refuse(stats, i, reject.to_string(), reject.reason()),
        }
    }
}

/// The events of a batch: its `items`, or the items of its `packed_items`, counted up to
/// and including an item the packed field cuts short (the fault, kept to refuse them).
struct BatchLen {
    events: usize,
    fault: Option<String>,
}

impl BatchLen {
    fn of(batch: &v1::SeriesBatch) -> BatchLen {
        let items = batch.items.len();
        if batch.packed_items.is_empty() {
            return BatchLen {
                events: items,
                fault: None,
            };
        }
        let (packed, fault) = match packed::count(&batch.packed_items) {
            Ok(n) => (n, None),
            Err(e) => (e.index + 1, Some(e.to_string())),
        };
        let fault = fault.or_else(|| {
            (items > 0).then(|| {
                format!(
                    "batch has {items} items and {packed} packed_items: a batch uses one or the other"
                )
            })
        });
        BatchLen {
            events: items + packed,
            fault,
        }
    }
}

/// Adds one batch, whose items are numbered from `first` in the request, to the table.
/// A problem of the batch itself (its series, times, weights or packed items) refuses
/// every item.
fn add_batch<'b>(
    table: &mut Table,
    batch: &'b v1::SeriesBatch,
    len: &BatchLen,
    first: usize,
    now: i64,
    stats: &mut IngestStats,
    refusals: &mut Refusals,
) {
    let n = len.events;
    if n == 0 {
        return;
    }
    let fits = |len: usize| len <= 1 || len == n;
    let series = if let Some(fault) = &len.fault {
        Err((fault.clone(), "bad_batch"))
    } else if fits(batch.times_unix_seconds.len()) && fits(batch.weights.len()) {
        table
            .resolve_tags(&batch.metric, &batch.tags, stats)
            .map_err(|r| (r.to_string(), r.reason()))
    } else {
        Err((
            format!(
                "batch has {} times and {} weights for {n} items: each must be 0, 1 or {n}",
                batch.times_unix_seconds.len(),
                batch.weights.len()
            ),
            "bad_batch",
        ))
    };
    let id = match series {
        Ok(id) => id,
        Err((why, reason)) => {
            for j in 0..n {
                refusals.refuse(stats, first + j, why.clone(), reason);
            }
            return;
        }
    };
    let mut run = Run::new(now);
    let mut add = |j: usize, item: &'b [u8]| {
        let time = event_time(one_or_each(&batch.times_unix_seconds, j), now);
        let weight = one_or_each(&batch.weights, j);
        match run.add(table, id, item, time, weight) {
            Ok(()) => stats.accepted += 1,
            Err(reject) => refusals.refuse(stats, first + j, reject.to_string(), reject.reason()),
        }
    };
    if batch.packed_items.is_empty() {
        for (j, item) in batch.items.iter().enumerate() {
            add(j, item);
        }
    } else {
        // Counted without a fault above, so every item reads.
        for (j, item) in packed::unpack(&batch.packed_items).enumerate() {
            add(j, item.unwrap_or_default());
        }
    }
    run.flush(table, id);
}

/// The accepted items of a batch not yet added, all of one hour: a batch's events are
/// nearly always of one hour, or of a few in turn, so the hour is checked and its entry
/// looked up once per run of them rather than once per item.
struct Run<'b> {
    hour: u32,
    /// The times of `hour` accepted without a check ([`Table::accepted_times`]); empty
    /// before the first item.
    times: std::ops::Range<i64>,
    items: Vec<(&'b [u8], u64)>,
    now: i64,
}

impl<'b> Run<'b> {
    fn new(now: i64) -> Run<'b> {
        Run {
            hour: 0,
            times: 0..0,
            items: Vec::new(),
            now,
        }
    }

    /// Takes one event of series `id`, or says why it is refused, exactly as
    /// [`Table::check`] would; an event of another hour first adds the run to `table`.
    fn add(
        &mut self,
        table: &mut Table,
        id: u64,
        item: &'b [u8],
        time: i64,
        weight: u64,
    ) -> Result<(), crate::table::Reject> {
        table.check_item(item)?;
        if !self.times.contains(&time) {
            let hour = table.hour_for(time, self.now)?;
            if hour != self.hour || self.times.is_empty() {
                self.flush(table, id);
                self.hour = hour;
                self.times = table.accepted_times(hour, self.now);
            }
        }
        self.items.push((item, weight));
        Ok(())
    }

    /// Adds the run to series `id` in `table`.
    fn flush(&mut self, table: &mut Table, id: u64) {
        table.insert_run(id, self.hour, &self.items);
        self.items.clear();
    }
}

/// The `j`-th of per-item values that may also be one value for all, or none (zero).
fn one_or_each<T: Copy + Default>(values: &[T], j: usize) -> T {
    values
        .get(j)
        .or(values.first())
        .copied()
        .unwrap_or_default()
}
