//! Property values as text, shared by the protocols.

/// An integer reading scaled (`v * scale + offset`) and rounded to the decimals of `scale` and
/// `offset`: a register of 358 scaled by 0.1 is `35.8`, not the binary float's
/// `35.800000000000004`.
pub fn scaled_integer(v: i128, scale: f64, offset: f64) -> String {
    let places = decimals(scale).max(decimals(offset));
    let x = v as f64 * scale + offset;
    let text = format!("{x:.places$}");
    let text = if text.contains('.') {
        text.trim_end_matches('0').trim_end_matches('.')
    } else {
        &text
    };
    if text == "-0" {
        "0".into()
    } else {
        text.to_string()
    }
}

/// Digits after the point of `x` as written (`0.1` has 1), at most 15.
fn decimals(x: f64) -> usize {
    let text = format!("{}", x.abs());
    text.split_once('.').map_or(0, |(_, d)| d.len()).min(15)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scaled_integers_keep_the_decimals_of_scale_and_offset() {
        assert_eq!(scaled_integer(358, 0.1, 0.0), "35.8");
        assert_eq!(scaled_integer(14380, 0.01, 0.0), "143.8");
        assert_eq!(scaled_integer(-205, 0.1, 0.0), "-20.5");
        assert_eq!(scaled_integer(5, 2.0, 1.0), "11");
        assert_eq!(scaled_integer(-1, 0.1, 0.1), "0");
        assert_eq!(scaled_integer(1, 1.0, 0.25), "1.25");
    }
}
