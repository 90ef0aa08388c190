//! Slurm host lists (`n[1-4]`, `gpu[01-08,12],login1`), as used by
//! `NodeName=` and by device lists such as `File=/dev/nvidia[0-3]`.
//!
//! Handled: comma-separated items, each with at most one bracket group of
//! comma-separated numbers and ranges (zero padding kept). Anything else
//! (two bracket groups, a step, an unclosed bracket) is an error the caller
//! reports, never a silent guess.

/// Why a host list could not be expanded.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("cannot expand host list `{list}`: {reason}")]
pub struct HostlistError {
    pub list: String,
    pub reason: &'static str,
}

/// Most names one list may expand to (a typo such as `n[1-99999999]` must
/// not allocate gigabytes).
const MAX_NAMES: usize = 65_536;

/// Expands `list` into its names, in order.
pub fn expand(list: &str) -> Result<Vec<String>, HostlistError> {
    let err = |reason| HostlistError {
        list: list.to_string(),
        reason,
    };
    let mut out = Vec::new();
    for item in split_top(list).map_err(err)? {
        if item.is_empty() {
            continue;
        }
        let Some(open) = item.find('[') else {
            if item.contains(']') {
                return Err(err("`]` without `[`"));
            }
            out.push(item.to_string());
            continue;
        };
        let close = item[open..]
            .find(']')
            .map(|c| open + c)
            .ok_or_else(|| err("unclosed `[`"))?;
        let (prefix, inner, suffix) = (&item[..open], &item[open + 1..close], &item[close + 1..]);
        if suffix.contains('[') || suffix.contains(']') {
            return Err(err("more than one bracket group"));
        }
        for part in inner.split(',') {
            let (lo, hi) = part.split_once('-').unwrap_or((part, part));
            let (a, b) = match (lo.trim().parse::<u64>(), hi.trim().parse::<u64>()) {
                (Ok(a), Ok(b)) if a <= b => (a, b),
                _ => return Err(err("a range is not N or N-M with N <= M")),
            };
            if out.len() as u64 + (b - a) >= MAX_NAMES as u64 {
                return Err(err("too many names"));
            }
            let width = lo.trim().len();
            for n in a..=b {
                out.push(format!("{prefix}{n:0width$}{suffix}"));
            }
        }
    }
    Ok(out)
}

/// Splits at commas outside brackets.
fn split_top(list: &str) -> Result<Vec<&str>, &'static str> {
    let mut out = Vec::new();
    let (mut depth, mut start) = (0i32, 0);
    for (i, c) in list.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth -= 1,
            ',' if depth == 0 => {
                out.push(list[start..i].trim());
                start = i + 1;
            }
            _ => {}
        }
        if !(0..=1).contains(&depth) {
            return Err("unbalanced or nested brackets");
        }
    }
    out.push(list[start..].trim());
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expands_ranges_lists_and_padding() {
        assert_eq!(expand("n1").unwrap(), ["n1"]);
        assert_eq!(expand("n[1-3]").unwrap(), ["n1", "n2", "n3"]);
        assert_eq!(
            expand("gpu[08-10,12],login").unwrap(),
            ["gpu08", "gpu09", "gpu10", "gpu12", "login"]
        );
        assert_eq!(
            expand("/dev/nvidia[0-1]").unwrap(),
            ["/dev/nvidia0", "/dev/nvidia1"]
        );
        assert_eq!(expand("a[1-2]-ib").unwrap(), ["a1-ib", "a2-ib"]);
        assert_eq!(expand("a,b").unwrap(), ["a", "b"]);
    }

    #[test]
    fn refuses_what_it_cannot_expand() {
        for bad in [
            "n[1-2]x[1-2]",
            "n[1-",
            "n1]",
            "n[3-1]",
            "n[a-b]",
            "n[[1]]",
            "n[1-999999999]",
        ] {
            assert!(expand(bad).is_err(), "{bad}");
        }
        let e = expand("n[1-2]r[1-2]").unwrap_err().to_string();
        assert!(e.contains("n[1-2]r[1-2]") && e.contains("bracket"), "{e}");
    }
}
