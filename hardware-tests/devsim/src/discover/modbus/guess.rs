//! What a run of registers may hold, guessed from the words alone: floats (either word order),
//! text, counters, flags; pure.

/// A guess of what some registers hold: its visitor's keys, the model's type, and why.
pub(super) struct Guess {
    pub(super) offset: u16,
    pub(super) count: u16,
    pub(super) data_type: &'static str,
    pub(super) byte_order: Option<&'static str>,
    pub(super) model_type: &'static str,
    pub(super) why: String,
    /// The value as the mapper reports it.
    pub(super) seen: String,
}

pub(super) fn float(hi: u16, lo: u16) -> Option<f32> {
    let f = f32::from_bits((u32::from(hi) << 16) | u32::from(lo));
    (f.is_normal() && (1e-3..=1e7).contains(&f.abs())).then_some(f)
}

pub(super) fn printable(b: u8) -> bool {
    (0x20..0x7f).contains(&b)
}

/// Registers that read as text from `i`: each register two characters (a NUL ends it); at
/// least two registers. Their number, with the register of NULs after text that filled its
/// last register (the padding a device keeps after a string), and whether a NUL ended it.
pub(super) fn text_at(words: &[u16], i: usize) -> Option<(usize, bool)> {
    let mut n = 0;
    let mut ended = false;
    for w in &words[i..] {
        let [a, b] = w.to_be_bytes();
        if !printable(a) {
            break;
        }
        n += 1;
        if b == 0 {
            ended = true;
            break;
        }
        if !printable(b) {
            n -= 1;
            break;
        }
    }
    if n >= 2 && !ended && words.get(i + n) == Some(&0) {
        n += 1;
    }
    (n >= 2).then_some((n, ended))
}

/// How many significant digits a float has as it prints shortest (21.5: 3, 123.456: 6,
/// 129400: 4, 0.0011822905: 8): what tells a value someone set or measured from registers that only
/// happen to make a float.
pub(super) fn digits(f: f32) -> usize {
    let d: String = f.to_string().chars().filter(char::is_ascii_digit).collect();
    // 129400 has four: the zeros at either end only place the point.
    d.trim_matches('0').len()
}

/// Whether a float reads as a value someone set or measured to a few digits (at most six:
/// 123.456, 21.5), rather than registers that only happen to make a float (123.00496).
pub(super) fn round(f: f32) -> bool {
    digits(f) <= 6
}

/// A round float32 of two words (`hi` first), if they make one.
fn round_float(hi: u16, lo: u16) -> Option<f32> {
    float(hi, lo).filter(|f| round(*f))
}

/// What a guess at one place reads: 0 a 16-bit integer, 1 a float ABCD, 2 a float CDAB, 3 text.
type Kind = u8;

/// The readings that may start at `i`: (score, registers, kind). The rules, in integers so that
/// equal readings are equal: an integer scores 10 a register; text 14 a register, 26 when it
/// ends with its NUL inside a register; a round float 30 plus 6 less its significant digits
/// (the rounder, the likelier it was set: -180 before 26.875), at most 35. So a round float
/// beats the integers its words are and text that runs on, and text that ends with its NUL
/// beats any float one of its words makes (with its own words, or with a word before it:
/// 26 + 10 > 35); a float that is not round is never one.
fn options(words: &[u16], i: usize) -> Vec<(i64, usize, Kind)> {
    let mut out: Vec<(i64, usize, Kind)> = vec![(10, 1, 0)];
    if let Some(&next) = words.get(i + 1) {
        for (kind, f) in [
            (1, round_float(words[i], next)),
            (2, round_float(next, words[i])),
        ] {
            if let Some(f) = f {
                out.push((30 + 5 - (digits(f).min(6) as i64 - 1), 2, kind));
            }
        }
    }
    if let Some((k, ended)) = text_at(words, i) {
        out.push((if ended { 26 } else { 14 } * k as i64, k, 3));
    }
    out
}

/// How registers from `start` read best (the highest total of [`options`]'s scores over the
/// whole run; a pure function of the words). A guess whose first register also starts another
/// valid reading (a round float, text) says so in its `why`, for the user to check.
pub(super) fn guesses(start: u16, words: &[u16]) -> Vec<Guess> {
    let n = words.len();
    // best[i]: the best total of words[i..], and the reading at i that gives it.
    let mut best: Vec<(i64, usize, Kind)> = vec![(0, 0, 0); n + 1];
    for i in (0..n).rev() {
        best[i] = options(words, i)
            .into_iter()
            .map(|(score, len, kind)| (score + best[i + len].0, len, kind))
            .fold((i64::MIN, 1, 0), |a, b| if b.0 > a.0 { b } else { a });
    }
    let mut out = Vec::new();
    let mut i = 0;
    while i < n {
        let (total, len, kind) = best[i];
        let mut g = guess(start, words, i, len, kind);
        // Another valid reading from here (a round float, text) that lost: said beside the
        // guess, "as likely" when it scores the same over the run.
        let other = options(words, i)
            .into_iter()
            .filter(|(_, l, k)| *k != 0 && (*l, *k) != (len, kind))
            .max_by_key(|(score, l, _)| score + best[i + l].0);
        if let Some((score, l, k)) = other {
            let alt = guess(start, words, i, l, k);
            let how = if score + best[i + l].0 == total {
                "as likely"
            } else {
                "also reads as"
            };
            g.why = format!(
                "{}; {how}: {} (check which the device holds)",
                g.why, alt.why
            );
        }
        out.push(g);
        i += len;
    }
    out
}

/// The guess of `len` registers at `i` read as `kind`.
fn guess(start: u16, words: &[u16], i: usize, len: usize, kind: Kind) -> Guess {
    let at = start + i as u16;
    let w = words[i];
    match kind {
        1 | 2 => {
            let (hi, lo) = if kind == 1 {
                (w, words[i + 1])
            } else {
                (words[i + 1], w)
            };
            let f = float(hi, lo).unwrap_or_default();
            Guess {
                offset: at,
                count: 2,
                data_type: "float32",
                byte_order: (kind == 2).then_some("CDAB"),
                model_type: "FLOAT",
                seen: f.to_string(),
                why: if kind == 1 {
                    format!("two registers that read as a float32 (ABCD): {f}")
                } else {
                    format!("two registers that read as a float32, low word first (CDAB): {f}")
                },
            }
        }
        3 => {
            let text: String = words[i..i + len]
                .iter()
                .flat_map(|w| w.to_be_bytes())
                .take_while(|b| *b != 0)
                .map(char::from)
                .collect();
            Guess {
                offset: at,
                count: len as u16,
                data_type: "string",
                byte_order: None,
                model_type: "STRING",
                why: format!("{len} registers that read as text: {text:?}"),
                // As the mapper reports it: trailing spaces trimmed.
                seen: text.trim_end_matches(' ').to_string(),
            }
        }
        // -4096 to -1: a negative value is far likelier than a count above 61440.
        _ if w >= 0xF000 => Guess {
            offset: at,
            count: 1,
            data_type: "int16",
            byte_order: None,
            model_type: "INT",
            why: format!(
                "{w} as unsigned: a small negative number? read {}",
                w as i16
            ),
            seen: (w as i16).to_string(),
        },
        _ => Guess {
            offset: at,
            count: 1,
            data_type: "uint16",
            byte_order: None,
            model_type: "INT",
            why: format!("read {w}"),
            seen: w.to_string(),
        },
    }
}

#[cfg(test)]
mod tests;
