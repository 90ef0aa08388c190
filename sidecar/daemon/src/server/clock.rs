//! The clock, as every layer of the server reads it (the bottom: it
//! imports nothing).

use std::time::{SystemTime, UNIX_EPOCH};

/// Now, in whole Unix seconds.
pub(super) fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Now, in Unix seconds.
pub(super) fn unix_now_f64() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}
