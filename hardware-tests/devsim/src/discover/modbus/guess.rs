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

/// Whether a float reads as a value someone set or measured to a few digits (123.456, 21.5),
/// rather than registers that only happen to make a float (123.00496).
pub(super) fn round(f: f32) -> bool {
    let digits = f
        .to_string()
        .chars()
        .filter(char::is_ascii_digit)
        .skip_while(|c| *c == '0')
        .count();
    digits <= 6
}

/// How registers from `start` read best: each register an integer, or a float32 in either
/// word order, or text, chosen over the whole run (a round float and text weigh more than the
/// integers they would be, a float that is not round a little more).
pub(super) fn guesses(start: u16, words: &[u16]) -> Vec<Guess> {
    let n = words.len();
    // best[i]: the best score of words[i..], and the guess at i that gives it.
    let mut best: Vec<(f64, usize, u8)> = vec![(0.0, 0, 0); n + 1];
    for i in (0..n).rev() {
        // Kinds: 0 integer, 1 float ABCD, 2 float CDAB, 3 text.
        let mut options: Vec<(f64, usize, u8)> = vec![(1.0, 1, 0)];
        if let Some(&next) = words.get(i + 1) {
            if let Some(f) = float(words[i], next) {
                options.push((if round(f) { 3.5 } else { 2.1 }, 2, 1));
            }
            if let Some(f) = float(next, words[i]) {
                options.push((if round(f) { 3.45 } else { 2.05 }, 2, 2));
            }
        }
        if let Some((k, ended)) = text_at(words, i) {
            // Text that ends with its NUL inside a register beats a float its words make.
            options.push((1.6 * k as f64 + if ended { 0.4 } else { 0.0 }, k, 3));
        }
        best[i] = options
            .into_iter()
            .map(|(score, len, kind)| (score + best[i + len].0, len, kind))
            .fold((f64::MIN, 1, 0), |a, b| if b.0 > a.0 { b } else { a });
    }
    let mut out = Vec::new();
    let mut i = 0;
    while i < n {
        let (_, len, kind) = best[i];
        let at = start + i as u16;
        let w = words[i];
        out.push(match kind {
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
                    seen: text,
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
        });
        i += len;
    }
    out
}
