//! Upload cap: a token bucket on blob payload bytes (`--max-upload-mbps`).
//!
//! Pure logic: the caller passes `now`. A reservation may drive the bucket into debt; the
//! answer is the instant at which that send may go, so queued uploads leave in FIFO order
//! at the capped rate. The bucket starts empty and holds at most one chunk, so a long
//! transfer is measured at the cap, not at cap plus a burst.
//!
//! The cap is off by default: a peer's uplink is the user's to share, and the per-requester
//! [`share::FairShare`] already keeps one requester from taking it all.

pub mod share;

use std::time::{Duration, Instant};

use crate::blob::CHUNK_SIZE;

/// Converts megabits per second to bytes per second.
pub fn mbps_to_bytes_per_sec(mbps: f64) -> u64 {
    (mbps * 1_000_000.0 / 8.0) as u64
}

/// Token bucket over bytes.
#[derive(Debug)]
pub struct UploadLimiter {
    /// Bytes per second; `None` = no cap.
    rate: Option<f64>,
    /// Most tokens the bucket holds.
    burst: f64,
    /// Current tokens; negative = debt of already scheduled sends.
    tokens: f64,
    last: Instant,
}

impl UploadLimiter {
    /// A limiter at `bytes_per_sec` (None or 0 = unlimited).
    pub fn new(bytes_per_sec: Option<u64>, now: Instant) -> Self {
        UploadLimiter {
            rate: bytes_per_sec.filter(|r| *r > 0).map(|r| r as f64),
            burst: CHUNK_SIZE as f64,
            tokens: 0.0,
            last: now,
        }
    }

    /// True when a cap is set.
    pub fn is_limited(&self) -> bool {
        self.rate.is_some()
    }

    /// Gives back a reservation that was not used.
    pub fn refund(&mut self, bytes: u64) {
        if self.rate.is_some() {
            self.tokens = (self.tokens + bytes as f64).min(self.burst);
        }
    }

    /// Reserves `bytes` and returns when they may be sent (`now` or later).
    pub fn reserve(&mut self, now: Instant, bytes: u64) -> Instant {
        let Some(rate) = self.rate else {
            return now;
        };
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = now.max(self.last);
        self.tokens = (self.tokens + elapsed * rate).min(self.burst);
        self.tokens -= bytes as f64;
        if self.tokens >= 0.0 {
            now
        } else {
            now + Duration::from_secs_f64(-self.tokens / rate)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unlimited_never_waits() {
        let t0 = Instant::now();
        let mut l = UploadLimiter::new(None, t0);
        assert_eq!(l.reserve(t0, 1 << 30), t0);
        assert!(!l.is_limited());
    }

    #[test]
    fn schedule_follows_the_rate() {
        let t0 = Instant::now();
        let rate = 1_000_000u64; // 1 MB/s
        let mut l = UploadLimiter::new(Some(rate), t0);
        // Ten back-to-back reservations of 100 kB: the last may go after ~1 s.
        let mut at = t0;
        for _ in 0..10 {
            at = l.reserve(t0, 100_000);
        }
        let secs = at.duration_since(t0).as_secs_f64();
        assert!((secs - 1.0).abs() < 1e-6, "{secs}");
        // After idling long, at most one burst goes immediately.
        let later = t0 + Duration::from_secs(100);
        assert_eq!(l.reserve(later, CHUNK_SIZE as u64), later);
        assert!(l.reserve(later, 1000) > later);
    }

    #[test]
    fn mbps_conversion() {
        assert_eq!(mbps_to_bytes_per_sec(10.0), 1_250_000);
    }
}
