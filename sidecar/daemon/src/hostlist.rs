//! Slurm's host lists (`gpu[01-03,07]`): pure code that both the Slurm
//! client ([`crate::slurm`]) and the grant check ([`crate::grant`]) read
//! with, so neither imports the other for it.

/// Whether Slurm's host list `nodes` (`gpu01`, `gpu[01-03,07]`,
/// `a,b[1-2]`) names `node`: top-level commas split names, and one bracket
/// group of numbers and ranges per name is expanded (zero padding kept).
pub fn names_node(nodes: &str, node: &str) -> bool {
    let mut depth = 0;
    let mut items = Vec::new();
    let mut from = 0;
    for (i, c) in nodes.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth -= 1,
            ',' if depth == 0 => {
                items.push(&nodes[from..i]);
                from = i + 1;
            }
            _ => {}
        }
    }
    items.push(&nodes[from..]);
    items.into_iter().any(|item| {
        let Some((prefix, rest)) = item.split_once('[') else {
            return item == node;
        };
        let Some((ranges, suffix)) = rest.split_once(']') else {
            return false;
        };
        let Some(middle) = node
            .strip_prefix(prefix)
            .and_then(|n| n.strip_suffix(suffix))
        else {
            return false;
        };
        ranges.split(',').any(|r| {
            let (lo, hi) = r.split_once('-').unwrap_or((r, r));
            let width = lo.len();
            let (Ok(lo), Ok(hi), Ok(n)) =
                (lo.parse::<u64>(), hi.parse::<u64>(), middle.parse::<u64>())
            else {
                return false;
            };
            (lo..=hi).contains(&n)
                && (middle.len() == width || width == 1 && !middle.starts_with('0'))
        })
    })
}
