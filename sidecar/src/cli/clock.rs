//! This machine's clock and its local time zone, for the commands that show
//! smartmigd's times (`status`, `plan`, `usage`, `advise report`): one owner
//! below them all, so none of them imports another for the time.

/// A Unix time in the local time zone (`TZ`, else /etc/localtime), e.g.
/// `2026-11-26 06:30:12`; the raw number if it is out of range.
pub fn local_time(unix: u64) -> String {
    i64::try_from(unix)
        .ok()
        .and_then(|s| jiff::Timestamp::from_second(s).ok())
        .map(|t| {
            t.to_zoned(jiff::tz::TimeZone::system())
                .strftime("%Y-%m-%d %H:%M:%S")
                .to_string()
        })
        .unwrap_or_else(|| unix.to_string())
}

/// Seconds since the Unix epoch (0 on a clock before it).
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}
