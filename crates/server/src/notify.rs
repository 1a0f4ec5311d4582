//! systemd's service notifications (`sd_notify`): status lines while loading, `READY=1` once a
//! request can be served, `WATCHDOG=1` from the engine loop, `STOPPING=1` on shutdown. Each is
//! a no-op when systemd did not start the process (no `NOTIFY_SOCKET`).

use std::time::{Duration, Instant};

use sd_notify::NotifyState;

fn send(state: &[NotifyState]) {
    if let Err(e) = sd_notify::notify(false, state) {
        tracing::warn!("sd_notify: {e}");
    }
}

/// Reports `text` as the service's status (`systemctl status` shows it).
pub fn status(text: &str) {
    send(&[NotifyState::Status(text)]);
}

pub(crate) fn ready(text: &str) {
    send(&[NotifyState::Ready, NotifyState::Status(text)]);
}

pub(crate) fn stopping() {
    send(&[
        NotifyState::Stopping,
        NotifyState::Status("draining requests in flight"),
    ]);
}

/// Keeps systemd's watchdog fed from the thread whose progress it vouches for: the engine's.
/// A wedged engine stops the pings, and systemd restarts the service, even while the HTTP side
/// still answers.
#[derive(Debug)]
pub(crate) struct Watchdog {
    interval: Duration,
    last: Instant,
}

impl Watchdog {
    /// The watchdog systemd asked for (`WATCHDOG_USEC` for this process), pinged at half its
    /// period.
    pub(crate) fn from_env() -> Option<Watchdog> {
        let mut usec = 0;
        if !sd_notify::watchdog_enabled(false, &mut usec) || usec == 0 {
            return None;
        }
        Some(Watchdog {
            interval: Duration::from_micros(usec / 2),
            last: Instant::now(),
        })
    }

    /// How long the engine may wait for work before it must ping.
    pub(crate) fn interval(&self) -> Duration {
        self.interval
    }

    /// Pings when half a period has passed since the last ping.
    pub(crate) fn pet(&mut self) {
        if self.last.elapsed() >= self.interval {
            send(&[NotifyState::Watchdog]);
            self.last = Instant::now();
        }
    }
}
