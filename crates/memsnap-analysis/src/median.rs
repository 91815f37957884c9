//! The median the rules compare counts by: the upper one, of a list sorted in place.

/// The upper median of `v` (sorted in place); the type's default when `v` is empty.
pub(crate) fn median<T: Copy + Ord + Default>(v: &mut [T]) -> T {
    v.sort_unstable();
    v.get(v.len() / 2).copied().unwrap_or_default()
}
