//! Reading an agent's log to the end, a bounded piece at a time: each read
//! goes on from where the last one stopped, so a fatal line is seen at any
//! offset of the log, however much the agent printed before it.
//!
//! `pods/log` has no byte offset to start from, only `sinceTime` (whole
//! seconds) and `limitBytes`. The kubelet (and KWOK) filter the container's
//! log file line by line on the time each line was written, so for one file
//! "the log since second S" is always the same lines in the same order, only
//! more of them as the agent writes on. A [`LogCursor`] therefore says: of
//! the log since `since` (timestamps on, `timestamps=true`), the first
//! `lines` complete lines (`bytes` bytes) were scanned, and of the next line
//! the first `open.scanned` bytes. The next read asks for the log since
//! `since`, at most `skip_bytes() + READ_LIMIT` bytes, skips what was
//! scanned and scans the rest, at most [`READ_LIMIT`] new bytes; a read that
//! hits the bound stops there (mid-line if need be) and the next read
//! continues from that byte, so nothing is skipped and nothing is scanned
//! twice.
//!
//! - Lines split across reads (by the bound, `limitBytes` or the end of
//!   what the agent wrote so far) are continued where they stopped, with
//!   the last [`PIECE_OVERLAP`] bytes scanned before put in front of the
//!   rest, so a fatal message cut in two is matched whole; the line counts
//!   once, when its newline arrives.
//! - Memory per pod is bounded whatever the log: a line longer than
//!   [`LINE_PIECE`] is scanned in pieces (each with the previous piece's last
//!   [`PIECE_OVERLAP`] bytes in front), and between reads only the cursor
//!   is kept (at most [`PIECE_OVERLAP`] bytes of an unfinished line).
//! - Skipping stays short: after each read `since` moves up to
//!   [`SINCE_MARGIN`] seconds before the newest line read (counting again
//!   which of the lines read are in the log since then), so a read re-sends
//!   only the last seconds of log, not the whole log. The margin covers a
//!   runtime that stamps stdout and stderr lines slightly out of order: a
//!   line stamped more than that before a line already read, but written
//!   after it, would not be seen (no CRI runtime does that).
//! - Each read checks it is still the log it read before: the last line it
//!   skips must hash as before, and an unfinished line's scanned bytes must
//!   end as before. Otherwise (the kubelet rotated or replaced the file) the
//!   read stops and the next one scans the log since `since` again from its
//!   first line (`ReadEnd::Resync`): lines may be scanned twice then, never
//!   skipped. Lines rotated away between two reads cannot be read by anyone
//!   through `pods/log`.
//! - Lines stamped after the window's end are not the gate's business: a
//!   read that reaches one has read the whole window (`ReadEnd::WindowRead`).

use std::collections::BTreeMap;

use jiff::Timestamp;

use super::logs::{LogMatch, Patterns};

/// New bytes one read scans at most; the next read goes on from there.
pub const READ_LIMIT: u64 = 1 << 20;
/// A longer line is scanned in pieces of this size...
pub const LINE_PIECE: usize = 64 << 10;
/// ...each with the previous piece's last bytes in front (and a line
/// continued by the next read with its last scanned bytes), so a message
/// shorter than this is matched even when cut between two pieces.
pub const PIECE_OVERLAP: usize = 4 << 10;
/// How many seconds before the newest line read the next read starts
/// (`sinceTime`).
pub const SINCE_MARGIN: i64 = 2;
/// The longest timestamp prefix looked for at the start of a line.
const HEAD: usize = 64;

/// How far an agent's log was read (see the module's documentation).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LogCursor {
    /// The next read's `sinceTime`, a whole second; `None`: the log from
    /// its start.
    pub since: Option<Timestamp>,
    /// Complete lines of the log since `since` scanned already.
    pub lines: u64,
    /// Their bytes, timestamps and newlines included.
    pub bytes: u64,
    /// Hash of the last of them: the next read checks it reads the same log.
    pub last_hash: Option<u64>,
    /// The line after them, begun but not ended when the last read stopped.
    pub open: Option<OpenLine>,
}

/// A line whose beginning a read scanned and whose rest the next one scans.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenLine {
    /// Bytes of it scanned (its timestamp included).
    pub scanned: u64,
    /// The last of them (at most [`PIECE_OVERLAP`]): scanned again in front
    /// of the rest, and compared with what the next read returns there.
    pub tail: Vec<u8>,
    /// Its timestamp.
    pub at: Option<Timestamp>,
}

/// What a read asks for beyond its bound (`limitBytes`): the timestamp of
/// a line cut right after the bound (read whole, so the line's text is told
/// from its timestamp) and some slack, so the read, not the server, stops
/// at the bound whenever both count the same bytes.
const REQUEST_SLACK: u64 = 4096;

impl LogCursor {
    /// Bytes of the log since `since` the next read skips.
    pub fn skip_bytes(&self) -> u64 {
        self.bytes + self.open.as_ref().map_or(0, |o| o.scanned)
    }

    /// The `limitBytes` of the next read scanning at most `limit` new bytes.
    pub fn request_bytes(&self, limit: u64) -> u64 {
        self.skip_bytes()
            .saturating_add(limit)
            .saturating_add(REQUEST_SLACK)
    }
}

/// How a read ended.
#[derive(Debug, Clone, PartialEq)]
pub enum ReadEnd {
    /// A line matched a pattern.
    Matched(LogMatch),
    /// Everything the log had was scanned.
    CaughtUp,
    /// A line stamped after the window's end was reached: the whole window
    /// was scanned.
    WindowRead,
    /// The read stopped at its bound; the next one goes on from there.
    Behind,
    /// The log is not the one read before (rotated or replaced): the next
    /// read scans it again since `since`.
    Resync,
    /// The read broke off (an error, a timeout): what it scanned counts.
    Interrupted,
}

/// What scans a piece of a line: `piece[new_from..]` was never scanned,
/// `piece[..new_from]` is the overlap scanned before.
pub trait LineScanner {
    fn scan(&mut self, piece: &[u8], new_from: usize) -> Option<LogMatch>;
}

impl LineScanner for &Patterns {
    fn scan(&mut self, piece: &[u8], _new_from: usize) -> Option<LogMatch> {
        self.match_line(&String::from_utf8_lossy(piece))
    }
}

/// FNV-1a, 64 bits: a line's fingerprint (the cursor is in memory only).
fn fnv(hash: u64, bytes: &[u8]) -> u64 {
    bytes.iter().fold(hash, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}
const FNV_START: u64 = 0xcbf2_9ce4_8422_2325;

/// The line being read.
struct Line {
    /// Bytes of it so far (this read).
    len: u64,
    /// Its first bytes, for its timestamp.
    head: Vec<u8>,
    hash: u64,
    /// Its timestamp, once looked for; and the length of the prefix
    /// (timestamp and space) the patterns do not see.
    at: Option<(Option<Timestamp>, usize)>,
    /// Bytes of it an earlier read scanned (all of them: `u64::MAX`).
    seen: u64,
    /// Bytes to scan: `buf[..carried]` were scanned before (the overlap).
    buf: Vec<u8>,
    carried: usize,
    /// Where `buf` starts in the line.
    buf_offset: u64,
}

impl Line {
    fn new(seen: u64) -> Self {
        Line {
            len: 0,
            head: Vec::new(),
            hash: FNV_START,
            at: None,
            seen,
            buf: Vec::new(),
            carried: 0,
            buf_offset: 0,
        }
    }
}

/// One read of an agent's log: fed the bytes `pods/log` returns for
/// `cursor.since` (with timestamps), in chunks of any size.
pub struct LogPass<S> {
    scanner: S,
    window_end: Option<Timestamp>,
    limit: u64,
    old: LogCursor,
    /// Complete lines of this read so far, and their bytes.
    index: u64,
    bytes: u64,
    line: Line,
    /// The timestamp of the last complete line (a line without one, such as
    /// the rest of a line whose start is older than `since`, takes it).
    prev_at: Option<Timestamp>,
    /// Bytes read beyond what earlier reads scanned (newlines included, as
    /// `limitBytes` counts them).
    scanned: u64,
    /// Complete lines (and bytes) by the second they were stamped in, for
    /// the seconds the next `since` may be; older ones are dropped, and the
    /// newest second dropped is remembered.
    buckets: BTreeMap<i64, (u64, u64)>,
    dropped_upto: Option<i64>,
    newest: Option<i64>,
    last_hash: Option<u64>,
    end: Option<ReadEnd>,
}

impl<S: LineScanner> LogPass<S> {
    /// A read going on from `cursor`, scanning at most `limit` new bytes,
    /// of lines stamped up to `window_end`.
    pub fn new(scanner: S, cursor: LogCursor, window_end: Option<Timestamp>, limit: u64) -> Self {
        let seen = Self::seen_of(&cursor, 0);
        LogPass {
            scanner,
            window_end,
            limit: limit.max(1),
            old: cursor,
            index: 0,
            bytes: 0,
            line: Line::new(seen),
            prev_at: None,
            scanned: 0,
            buckets: BTreeMap::new(),
            dropped_upto: None,
            newest: None,
            last_hash: None,
            end: None,
        }
    }

    fn seen_of(cursor: &LogCursor, index: u64) -> u64 {
        if index < cursor.lines {
            u64::MAX
        } else if index == cursor.lines {
            cursor.open.as_ref().map_or(0, |o| o.scanned)
        } else {
            0
        }
    }

    /// Feeds the next bytes of the log; true once the read is done (a
    /// match, the bound, the window's end, another log): stop reading.
    pub fn feed(&mut self, mut data: &[u8]) -> bool {
        while !data.is_empty() && !self.done() {
            let newline = data.iter().position(|b| *b == b'\n');
            let segment = &data[..newline.unwrap_or(data.len())];
            let taken = self.take(segment);
            if self.done() {
                break;
            }
            data = &data[taken..];
            if taken == segment.len() && newline.is_some() {
                let skipped = self.line.seen == u64::MAX;
                self.end_line();
                if !skipped {
                    self.scanned += 1;
                }
                data = &data[1..];
            }
        }
        self.done()
    }

    /// Whether the read is over: it ended, or it reached its bound (but
    /// not inside a line's timestamp: the line's text must be told from it).
    fn done(&self) -> bool {
        self.end.is_some()
            || (self.scanned >= self.limit && (self.line.len == 0 || self.stamp_known()))
    }

    /// Whether the current line's timestamp can be told (a space within its
    /// first bytes ends it; without one it has none).
    fn stamp_known(&self) -> bool {
        self.line.at.is_some() || self.line.head.len() >= HEAD || self.line.head.contains(&b' ')
    }

    /// Takes bytes of the current line (no newline among them); returns how
    /// many (fewer at the bound).
    fn take(&mut self, segment: &[u8]) -> usize {
        let mut taken = 0;
        // The part an earlier read scanned.
        if self.line.len < self.line.seen {
            let n = segment
                .len()
                .min(usize::try_from(self.line.seen - self.line.len).unwrap_or(usize::MAX));
            self.absorb(&segment[..n]);
            if self.line.seen != u64::MAX {
                // The unfinished line: keep its last bytes, to compare and
                // to scan again in front of the rest.
                self.line.buf.extend_from_slice(&segment[..n]);
                let excess = self.line.buf.len().saturating_sub(PIECE_OVERLAP);
                self.line.buf.drain(..excess);
            }
            taken = n;
            if self.line.len == self.line.seen && self.line.seen != u64::MAX {
                self.reached_open_end();
                if self.done() {
                    return taken;
                }
            }
        }
        // The new part, up to the bound (a timestamp is read whole first).
        let mut rest = &segment[taken..];
        while !rest.is_empty() {
            let room = if self.stamp_known() {
                usize::try_from(self.limit.saturating_sub(self.scanned)).unwrap_or(usize::MAX)
            } else {
                let want = HEAD - self.line.head.len();
                rest.iter()
                    .take(want)
                    .position(|b| *b == b' ')
                    .map_or(want, |space| space + 1)
            };
            let space = (LINE_PIECE + self.line.carried).saturating_sub(self.line.buf.len());
            let n = rest.len().min(room).min(space.max(1));
            if n == 0 {
                break;
            }
            self.absorb(&rest[..n]);
            if self.line.buf.is_empty() {
                self.line.buf_offset = self.line.len - n as u64;
            }
            self.line.buf.extend_from_slice(&rest[..n]);
            self.scanned += n as u64;
            taken += n;
            rest = &rest[n..];
            if self.line.buf.len() >= LINE_PIECE + self.line.carried {
                self.scan_piece(false);
                if self.end.is_some() {
                    return taken;
                }
            }
        }
        taken
    }

    /// Counts bytes of the current line (hash, head, length).
    fn absorb(&mut self, bytes: &[u8]) {
        self.line.hash = fnv(self.line.hash, bytes);
        if self.line.head.len() < HEAD {
            let n = bytes.len().min(HEAD - self.line.head.len());
            self.line.head.extend_from_slice(&bytes[..n]);
        }
        self.line.len += bytes.len() as u64;
    }

    /// The read reached the end of what an earlier read scanned of the
    /// unfinished line: is it the same line?
    fn reached_open_end(&mut self) {
        let same = self.old.open.as_ref().is_some_and(|o| {
            self.line.buf.len() >= o.tail.len() && self.line.buf.ends_with(&o.tail)
        });
        if !same {
            self.end = Some(ReadEnd::Resync);
            return;
        }
        // Scanned again in front of the rest (its timestamp is read again
        // from its first bytes, which `head` holds).
        self.line.carried = self.line.buf.len();
        self.line.buf_offset = self.line.len - self.line.buf.len() as u64;
    }

    /// The line's timestamp (looked for once) and prefix length.
    fn stamp(&mut self) -> (Option<Timestamp>, usize) {
        if let Some(at) = self.line.at {
            return at;
        }
        let found = self
            .line
            .head
            .iter()
            .position(|b| *b == b' ')
            .and_then(|space| {
                let text = std::str::from_utf8(&self.line.head[..space]).ok()?;
                Some((text.parse::<Timestamp>().ok()?, space + 1))
            });
        let at = match found {
            Some((t, prefix)) => (Some(t), prefix),
            // The rest of a line whose start is older than `since`, or a
            // log without timestamps: as the line before (or `since`).
            None => (self.prev_at.or(self.old.since), 0),
        };
        self.line.at = Some(at);
        at
    }

    /// Scans what `buf` holds (the last piece of the line: `last`).
    fn scan_piece(&mut self, last: bool) {
        let (at, prefix) = self.stamp();
        if let (Some(end), Some(at)) = (self.window_end, at)
            && at > end
        {
            self.end = Some(ReadEnd::WindowRead);
            return;
        }
        if self.line.buf.len() > self.line.carried {
            let skip = usize::try_from((prefix as u64).saturating_sub(self.line.buf_offset))
                .unwrap_or(usize::MAX)
                .min(self.line.buf.len());
            let new_from = self.line.carried.saturating_sub(skip);
            if let Some(m) = self.scanner.scan(&self.line.buf[skip..], new_from) {
                self.end = Some(ReadEnd::Matched(m));
                return;
            }
        }
        if !last {
            let keep = self.line.buf.len().min(PIECE_OVERLAP);
            let drop = self.line.buf.len() - keep;
            self.line.buf.drain(..drop);
            self.line.buf_offset += drop as u64;
            self.line.carried = keep;
        }
    }

    /// The current line's newline arrived.
    fn end_line(&mut self) {
        if self.line.seen != u64::MAX {
            if self.line.len < self.line.seen {
                // Shorter than the unfinished line read before: another log.
                self.end = Some(ReadEnd::Resync);
                return;
            }
            self.scan_piece(true);
            if self.end.is_some() {
                return;
            }
        }
        let (at, _) = self.stamp();
        if self.index + 1 == self.old.lines && self.old.last_hash != Some(self.line.hash) {
            self.end = Some(ReadEnd::Resync);
            return;
        }
        let bytes = self.line.len + 1;
        self.index += 1;
        self.bytes += bytes;
        self.last_hash = Some(self.line.hash);
        self.prev_at = at;
        let second = at.map_or(i64::MIN, |t| t.as_second());
        let newest = self.newest.map_or(second, |n| n.max(second));
        self.newest = Some(newest);
        let bucket = self.buckets.entry(second).or_default();
        bucket.0 += 1;
        bucket.1 += bytes;
        // Only the seconds the next `since` may be are kept.
        let keep_from = newest.saturating_sub(SINCE_MARGIN);
        let kept = self.buckets.split_off(&keep_from);
        if let Some((&dropped, _)) = self.buckets.last_key_value() {
            self.dropped_upto = Some(self.dropped_upto.map_or(dropped, |d| d.max(dropped)));
        }
        self.buckets = kept;
        self.line = Line::new(Self::seen_of(&self.old, self.index));
    }

    /// Ends the read: `eof` when the log ended (else it broke off or was
    /// stopped). Returns the cursor of the next read and how this one ended.
    pub fn finish(mut self, eof: bool) -> (LogCursor, ReadEnd) {
        match self.end.take() {
            Some(ReadEnd::Resync) => return (self.restart(), ReadEnd::Resync),
            Some(end @ (ReadEnd::Matched(_) | ReadEnd::WindowRead)) => return (self.old, end),
            _ => {}
        }
        let before_new = self.index < self.old.lines
            || (self.index == self.old.lines && self.line.len < self.line.seen);
        if before_new {
            // Nothing new was reached: a log that ends there is another log.
            return if eof {
                (self.restart(), ReadEnd::Resync)
            } else {
                (self.old, ReadEnd::Interrupted)
            };
        }
        let mut open = None;
        if self.line.len > 0 && !self.stamp_known() {
            // Cut inside what may be its timestamp: nothing of it was
            // scanned, the next read takes it from its start.
            self.scanned = self.scanned.saturating_sub(self.line.len);
        } else if self.line.len > 0 {
            // An unfinished line: scan what came of it, keep its last bytes.
            self.scan_piece(false);
            if let Some(end) = self.end.take() {
                return (self.old, end);
            }
            let (at, _) = self.stamp();
            open = Some(OpenLine {
                scanned: self.line.len,
                tail: self.line.buf.clone(),
                at,
            });
        }
        let end = if self.scanned >= self.limit {
            ReadEnd::Behind
        } else if eof {
            ReadEnd::CaughtUp
        } else {
            ReadEnd::Interrupted
        };
        (self.rebase(open), end)
    }

    /// The next read scans the log since `since` again, from its first line.
    fn restart(&self) -> LogCursor {
        LogCursor {
            since: self.old.since,
            ..LogCursor::default()
        }
    }

    /// The cursor after this read, `since` moved up where it can be.
    fn rebase(&self, open: Option<OpenLine>) -> LogCursor {
        let same = LogCursor {
            since: self.old.since,
            lines: self.index,
            bytes: self.bytes,
            last_hash: self.last_hash,
            open: open.clone(),
        };
        let Some(newest) = self.newest.filter(|n| *n != i64::MIN) else {
            return same;
        };
        let mut to = newest.saturating_sub(SINCE_MARGIN);
        if let Some(o) = &open {
            // The unfinished line must be in the log since then.
            match o.at {
                Some(at) => to = to.min(at.as_second()),
                None => return same,
            }
        }
        let old = self.old.since.map(|s| s.as_second());
        if old.is_some_and(|o| to <= o) || self.dropped_upto.is_some_and(|d| to <= d) {
            return same;
        }
        let Ok(since) = Timestamp::from_second(to) else {
            return same;
        };
        let (lines, bytes) = self
            .buckets
            .range(to..)
            .fold((0, 0), |(l, b), (_, (n, m))| (l + n, b + m));
        LogCursor {
            since: Some(since),
            lines,
            bytes,
            // The last line read is the last of those unless it was stamped
            // before `since` (then the check fails and the log is read
            // again since `since`: never a line missed).
            last_hash: (lines > 0).then_some(self.last_hash).flatten(),
            open,
        }
    }
}

#[cfg(test)]
mod tests {
    use saferollout_api::LogsGate;

    use super::*;

    /// One CRI entry of the fake container log: when it was written, its
    /// text, and whether its newline was written yet.
    #[derive(Clone)]
    struct Entry {
        at: Timestamp,
        text: String,
        ended: bool,
    }

    /// What `pods/log?timestamps=true&sinceTime=..&limitBytes=..` returns:
    /// the kubelet filters the file line by line on the time, prefixes each
    /// line with it and cuts the output at the limit (mid-line if need be).
    fn serve(log: &[Entry], since: Option<Timestamp>, limit: u64) -> Vec<u8> {
        let mut out = Vec::new();
        for e in log.iter().filter(|e| since.is_none_or(|s| e.at >= s)) {
            out.extend_from_slice(
                e.at.strftime("%Y-%m-%dT%H:%M:%S%.9fZ ")
                    .to_string()
                    .as_bytes(),
            );
            out.extend_from_slice(e.text.as_bytes());
            if e.ended {
                out.push(b'\n');
            }
        }
        out.truncate(usize::try_from(limit).unwrap());
        out
    }

    /// Records the new bytes of every piece scanned; matches `FATAL`.
    #[derive(Default)]
    struct Recorder {
        new: Vec<u8>,
    }

    impl LineScanner for &mut Recorder {
        fn scan(&mut self, piece: &[u8], new_from: usize) -> Option<LogMatch> {
            self.new.extend_from_slice(&piece[new_from..]);
            let text = String::from_utf8_lossy(piece);
            text.contains("FATAL").then(|| LogMatch {
                pattern: "FATAL".into(),
                origin: "test".into(),
                line: clean_line_for_test(&text),
            })
        }
    }

    fn clean_line_for_test(text: &str) -> String {
        text.chars().take(80).collect()
    }

    fn ts(nanos: i64) -> Timestamp {
        Timestamp::from_nanosecond(1_800_000_000_000_000_000 + i128::from(nanos)).unwrap()
    }

    /// One read, fed in chunks of `chunk` bytes.
    fn read<S: LineScanner>(
        log: &[Entry],
        scanner: S,
        cursor: LogCursor,
        window_end: Option<Timestamp>,
        limit: u64,
        chunk: usize,
    ) -> (LogCursor, ReadEnd) {
        let bytes = serve(log, cursor.since, cursor.request_bytes(limit));
        let mut pass = LogPass::new(scanner, cursor, window_end, limit);
        for piece in bytes.chunks(chunk.max(1)) {
            if pass.feed(piece) {
                return pass.finish(false);
            }
        }
        pass.finish(true)
    }

    fn entry(at: Timestamp, text: impl Into<String>) -> Entry {
        Entry {
            at,
            text: text.into(),
            ended: true,
        }
    }

    /// Every line's text scanned exactly once, whatever the bound, the
    /// chunks the bytes come in, the lines split between reads and the
    /// log growing (and a last line not ended yet) between reads.
    #[test]
    fn every_line_is_scanned_once_across_reads() {
        for limit in [1u64, 7, 100, 1000, 1 << 20] {
            for chunk in [1usize, 3, 64, 4096] {
                let mut all: Vec<Entry> = Vec::new();
                let mut log: Vec<Entry> = Vec::new();
                let mut n = 0i64;
                // Tiny bounds take a read per byte: fewer lines then.
                let count = if limit < 100 { 60 } else { 300 };
                for i in 0..count {
                    // About four lines a second, some in the same nanosecond.
                    n += [0, 1, 900_000_000, 7][(i % 4) as usize];
                    let text = format!("line {i} {}", "x".repeat((i * 37 % 300) as usize));
                    all.push(entry(ts(n), text));
                }
                let mut recorder = Recorder::default();
                let mut cursor = LogCursor::default();
                let mut written = 0;
                let mut reads = 0;
                let mut max_skip = 0;
                loop {
                    // The agent writes on between reads: ten more lines, the
                    // last of them half written.
                    log.truncate(written);
                    written = (written + 10).min(all.len());
                    log.extend(all[log.len()..written].iter().cloned());
                    let mut half = None;
                    if written < all.len() {
                        let e = &all[written];
                        let cut = e.text.len() / 2;
                        half = Some(Entry {
                            at: e.at,
                            text: e.text[..cut].to_string(),
                            ended: false,
                        });
                    }
                    log.extend(half.clone());
                    let before = recorder.new.len();
                    max_skip = max_skip.max(cursor.skip_bytes());
                    let (next, end) = read(&log, &mut recorder, cursor, None, limit, chunk);
                    assert!(
                        (recorder.new.len() - before) as u64 <= limit,
                        "limit {limit}, chunk {chunk}: a read scanned {} bytes",
                        recorder.new.len() - before
                    );
                    assert!(
                        matches!(end, ReadEnd::CaughtUp | ReadEnd::Behind),
                        "{end:?}"
                    );
                    cursor = next;
                    reads += 1;
                    assert!(reads < 2_000_000, "no progress");
                    if written == all.len() && end == ReadEnd::CaughtUp && half.is_none() {
                        break;
                    }
                }
                let expected: Vec<u8> = all.iter().flat_map(|e| e.text.bytes()).collect();
                assert!(
                    recorder.new == expected,
                    "limit {limit}, chunk {chunk}: scanned {} bytes, the log has {}",
                    recorder.new.len(),
                    expected.len()
                );
                // The reads skip only the last seconds, not the whole log.
                let log_bytes = serve(&all, None, u64::MAX).len() as u64;
                assert!(
                    max_skip < log_bytes / 3,
                    "skipped up to {max_skip} of {log_bytes}"
                );
                assert!(cursor.since.is_some());
            }
        }
    }

    fn patterns() -> Patterns {
        let gate: LogsGate = serde_json::from_value(serde_json::json!({})).unwrap();
        Patterns::of(&gate).unwrap()
    }

    fn read_until_done(
        log: &[Entry],
        patterns: &Patterns,
        window_end: Option<Timestamp>,
        limit: u64,
    ) -> (ReadEnd, usize) {
        let mut cursor = LogCursor::default();
        for reads in 1..100 {
            let (next, end) = read(log, patterns, cursor, window_end, limit, 64 << 10);
            if end != ReadEnd::Behind {
                return (end, reads);
            }
            cursor = next;
        }
        panic!("never done");
    }

    /// The case that failed open: megabytes of routine lines, all stamped
    /// in the same instant, then the fatal line.
    #[test]
    fn a_fatal_line_after_megabytes_of_noise_in_one_instant_is_found() {
        let at = ts(0);
        let mut log: Vec<Entry> = (0..30_000)
            .map(|i| {
                entry(
                    at,
                    format!("I0102 health check {i}: device gpu-{} ok", i % 8),
                )
            })
            .collect();
        let noise = serve(&log, None, u64::MAX).len();
        assert!(noise > 2 << 20, "{noise}");
        log.push(entry(
            at,
            "E0102 main.go:131] Failed to initialize NVML: could not load NVML library",
        ));
        log.push(entry(at, "I0102 Registered device plugin"));
        let (end, reads) = read_until_done(&log, &patterns(), None, READ_LIMIT);
        match end {
            ReadEnd::Matched(m) => assert!(m.line.contains("Failed to initialize NVML"), "{m:?}"),
            other => panic!("{other:?}"),
        }
        assert_eq!(reads, 3, "1 MiB a read");
    }

    /// A fatal message cut by the read's bound, or between two pieces of a
    /// long line, is matched whole.
    #[test]
    fn a_message_cut_between_reads_or_pieces_is_matched_whole() {
        let message = "Failed to initialize NVML: could not load NVML library";
        let prefix = serve(&[entry(ts(0), "")], None, u64::MAX).len();
        // Between pieces of a long line: the message straddles LINE_PIECE.
        let before = LINE_PIECE - prefix - 10;
        let long = format!("{}{message}{}", "a".repeat(before), "b".repeat(100_000));
        let log = [entry(ts(0), long.clone())];
        let (end, _) = read_until_done(&log, &patterns(), None, READ_LIMIT);
        assert!(matches!(end, ReadEnd::Matched(_)), "{end:?}");
        // Between two reads: the bound falls inside the message.
        let log = [
            entry(ts(0), "start"),
            entry(ts(1), format!("{}{message}", "c".repeat(500))),
        ];
        let cut_at = (prefix + 6 + prefix + 500 + 10) as u64;
        let (end, reads) = read_until_done(&log, &patterns(), None, cut_at);
        assert!(matches!(end, ReadEnd::Matched(_)), "{end:?}");
        assert_eq!(reads, 2);
        // And in 7-byte reads, across many pieces and reads at once.
        let (end, reads) = read_until_done(&log, &patterns(), None, 7);
        assert!(matches!(end, ReadEnd::Matched(_)), "{end:?}");
        assert!(reads > 50, "{reads}");
        // Each piece of a long line is scanned: memory stays bounded.
        let clean = [entry(ts(0), "z".repeat(3 * LINE_PIECE))];
        let mut recorder = Recorder::default();
        let (_, end) = read(
            &clean,
            &mut recorder,
            LogCursor::default(),
            None,
            READ_LIMIT,
            4096,
        );
        assert_eq!(end, ReadEnd::CaughtUp);
        assert_eq!(recorder.new.len(), 3 * LINE_PIECE);
    }

    /// A line the agent has not ended yet is scanned as far as it goes, and
    /// only its rest once it is ended.
    #[test]
    fn an_unfinished_line_is_continued_not_scanned_again() {
        let mut recorder = Recorder::default();
        let half = Entry {
            at: ts(5),
            text: "abc".into(),
            ended: false,
        };
        let (cursor, end) = read(
            &[entry(ts(0), "first"), half],
            &mut recorder,
            LogCursor::default(),
            None,
            READ_LIMIT,
            2,
        );
        assert_eq!(end, ReadEnd::CaughtUp);
        assert_eq!(
            cursor.open.as_ref().map(|o| o.tail.ends_with(b"abc")),
            Some(true)
        );
        let log = [
            entry(ts(0), "first"),
            entry(ts(5), "abcdef"),
            entry(ts(6), "last"),
        ];
        let (cursor, end) = read(&log, &mut recorder, cursor, None, READ_LIMIT, 2);
        assert_eq!(end, ReadEnd::CaughtUp);
        assert_eq!(String::from_utf8_lossy(&recorder.new), "firstabcdeflast");
        assert_eq!(cursor.open, None);
        // Nothing new: nothing scanned.
        let (_, end) = read(&log, &mut recorder, cursor, None, READ_LIMIT, 2);
        assert_eq!(end, ReadEnd::CaughtUp);
        assert_eq!(String::from_utf8_lossy(&recorder.new), "firstabcdeflast");
    }

    /// A log that is not the one read before (rotated, replaced) is read
    /// again since the cursor's `since`: lines may be scanned twice then,
    /// never skipped.
    #[test]
    fn a_replaced_log_is_read_again_not_skipped() {
        let mut recorder = Recorder::default();
        let old = [entry(ts(0), "one"), entry(ts(1), "two")];
        let (cursor, _) = read(&old, &mut recorder, LogCursor::default(), None, 1000, 16);
        assert_eq!(cursor.lines, 2);
        let new = [
            entry(ts(2), "uno"),
            entry(ts(3), "dos"),
            entry(ts(4), "FATAL tres"),
        ];
        let (cursor, end) = read(&new, &mut recorder, cursor, None, 1000, 16);
        assert_eq!(end, ReadEnd::Resync);
        assert_eq!(cursor.lines, 0);
        let (_, end) = read(&new, &mut recorder, cursor, None, 1000, 16);
        assert!(matches!(end, ReadEnd::Matched(_)), "{end:?}");
        assert_eq!(
            String::from_utf8_lossy(&recorder.new),
            "onetwounodosFATAL tres"
        );
        // An unfinished line that went on differently is another log too.
        let mut recorder = Recorder::default();
        let half = Entry {
            at: ts(0),
            text: "abc".into(),
            ended: false,
        };
        let (cursor, _) = read(&[half], &mut recorder, LogCursor::default(), None, 1000, 16);
        let (_, end) = read(
            &[entry(ts(0), "xbcdef")],
            &mut recorder,
            cursor,
            None,
            1000,
            16,
        );
        assert_eq!(end, ReadEnd::Resync);
    }

    /// Lines stamped after the window are not the gate's: reaching one ends
    /// the read with the whole window read.
    #[test]
    fn a_line_after_the_window_ends_the_read() {
        let log = [
            entry(ts(0), "ok"),
            entry(ts(10), "fine"),
            entry(ts(20), "Failed to initialize NVML"),
        ];
        let (end, _) = read_until_done(&log, &patterns(), Some(ts(15)), READ_LIMIT);
        assert_eq!(end, ReadEnd::WindowRead);
        let (end, _) = read_until_done(&log, &patterns(), Some(ts(25)), READ_LIMIT);
        assert!(matches!(end, ReadEnd::Matched(_)), "{end:?}");
    }
}
