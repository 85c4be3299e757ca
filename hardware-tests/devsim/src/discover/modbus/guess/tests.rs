use super::*;
use proptest::prelude::*;

fn words(f: f32) -> (u16, u16) {
    let b = f.to_bits();
    ((b >> 16) as u16, b as u16)
}

/// Text as a device keeps it: two characters a register, ended by a NUL (a register of NULs
/// after text that fills its last one).
fn text(s: &str) -> Vec<u16> {
    let mut b = s.as_bytes().to_vec();
    b.push(0);
    if b.len() % 2 == 1 {
        b.push(0);
    }
    b.chunks(2)
        .map(|c| u16::from_be_bytes([c[0], c[1]]))
        .collect()
}

/// A guess as the tests compare it: offset, data type, word order, the value seen.
type Drafted<'a> = (u16, &'a str, Option<&'a str>, String);

fn kinds(g: &[Guess]) -> Vec<Drafted<'_>> {
    g.iter()
        .map(|g| (g.offset, g.data_type, g.byte_order, g.seen.clone()))
        .collect()
}

#[test]
fn a_float_that_is_not_round_is_two_integers() {
    // The cases: 15002 beside -2282 made float32 0.0011822905; 564 and 17573 made
    // 1320.0688 (CDAB). Neither is round: integers.
    let g = guesses(0, &[15002, (-2282i16) as u16]);
    assert_eq!(
        kinds(&g),
        [
            (0, "uint16", None, "15002".into()),
            (1, "int16", None, "-2282".into())
        ]
    );
    let g = guesses(0, &[564, 17573]);
    assert!(g.iter().all(|g| g.data_type == "uint16"), "{:?}", kinds(&g));
}

/// A word that makes a round float (ABCD) with `hi` after it, less round than `than`.
fn overlapping(hi: u16, than: f32) -> (u16, f32) {
    (0..=u16::MAX)
        .find_map(|x| {
            float(x, hi)
                .filter(|f| round(*f) && digits(*f) > digits(than))
                .map(|f| (x, f))
        })
        .expect("a word that makes a round float with it")
}

#[test]
fn the_rounder_float_wins_and_a_planted_one_is_not_lost() {
    // -180.0 planted after a word that, with the float's first word, makes another round (but
    // less round) float, as in the issue (26.875 beside a planted -180.0).
    let (hi, lo) = words(-180.0);
    let (x, other) = overlapping(hi, -180.0);
    let g = guesses(0, &[7, x, hi, lo]);
    assert_eq!(g.len(), 3, "{:?}", kinds(&g));
    assert_eq!((g[2].offset, g[2].data_type), (2, "float32"));
    assert_eq!(g[2].seen, "-180");
    // The other reading is said beside the register that starts it.
    assert!(
        g[1].why.contains(&format!(
            "also reads as: two registers that read as a float32 (ABCD): {other}"
        )),
        "{}",
        g[1].why
    );
}

#[test]
fn text_that_ends_with_its_nul_beats_the_floats_its_words_make() {
    // "DIaHoho": its first two registers make the round float 805.52.
    let t = text("DIaHoho");
    assert!(float(t[0], t[1]).is_some_and(round));
    let g = guesses(0, &t);
    assert_eq!(kinds(&g), [(0, "string", None, "DIaHoho".into())]);
    // Trailing spaces: reported as the mapper reports them (trimmed).
    let g = guesses(0, &text("OVEN-3  "));
    assert_eq!(g[0].seen, "OVEN-3");
}

/// One item of a layout a device may have.
#[derive(Clone, Debug)]
enum Item {
    Uint(u16),
    Neg(i16),
    Float(f32, bool),
    Text(String),
}

fn arb_item() -> impl Strategy<Value = Item> {
    prop_oneof![
        (0u16..0xF000).prop_map(Item::Uint),
        (-4096i16..0).prop_map(Item::Neg),
        (1i32..9999, -2i32..4, any::<bool>(), any::<bool>()).prop_map(|(m, e, neg, cdab)| {
            let f = m as f32 * 10f32.powi(e) * if neg { -1.0 } else { 1.0 };
            Item::Float(f, cdab)
        }),
        // At least three characters (two registers with the NUL), no trailing space.
        "[A-Za-z0-9.-][A-Za-z0-9 .-]{1,10}[A-Za-z0-9.-]".prop_map(Item::Text),
    ]
}

/// The layout's words, and what a draft must say of each item: (offset, type, order, seen).
fn lay(items: &[Item]) -> (Vec<u16>, Vec<Drafted<'static>>) {
    let mut w = Vec::new();
    let mut want = Vec::new();
    for it in items {
        let at = w.len() as u16;
        match it {
            Item::Uint(v) => {
                w.push(*v);
                want.push((at, "uint16", None, v.to_string()));
            }
            Item::Neg(v) => {
                w.push(*v as u16);
                want.push((at, "int16", None, v.to_string()));
            }
            Item::Float(f, cdab) => {
                let (hi, lo) = words(*f);
                if *cdab {
                    w.extend([lo, hi]);
                } else {
                    w.extend([hi, lo]);
                }
                want.push((at, "float32", cdab.then_some("CDAB"), f.to_string()));
            }
            Item::Text(s) => {
                w.extend(text(s));
                want.push((at, "string", None, s.clone()));
            }
        }
    }
    (w, want)
}

proptest! {
    /// Random layouts: every float drafted is round; every text that ends with its NUL inside a
    /// register is drafted whole; and where no two words that are not one planted float happen
    /// to make a round float, the draft is the layout exactly.
    #[test]
    fn a_random_layout_is_read_by_the_rules(
        items in proptest::collection::vec(arb_item(), 1..12)
            .prop_filter("round floats only", |v| v.iter().all(|i| match i {
                Item::Float(f, _) => float(words(*f).0, words(*f).1).is_some_and(round),
                _ => true,
            }))
    ) {
        let (w, want) = lay(&items);
        let g = guesses(0, &w);
        for x in &g {
            if x.data_type == "float32" {
                let f: f32 = x.seen.parse().expect("a float");
                prop_assert!(round(f), "{} drafted as a float", x.seen);
            }
        }
        let got = kinds(&g);
        // A text that ends with its NUL is drafted to its end (taking in words before it that
        // read as characters too).
        for (it, wanted) in items.iter().zip(&want) {
            if let Item::Text(s) = it && s.len() % 2 == 1 {
                let end = wanted.0 + text(s).len() as u16;
                prop_assert!(
                    g.iter().any(|x| x.data_type == "string" && x.seen.ends_with(s.as_str())
                        && x.offset <= wanted.0 && x.offset + x.count == end),
                    "text {:?} not drafted whole: {:?}", s, got
                );
            }
        }
        // Accidental round floats: any two neighbouring words, either way round, that are not
        // one planted float.
        let planted: Vec<u16> = want.iter().filter(|x| x.1 == "float32").map(|x| x.0).collect();
        let both = |i: usize| {
            float(w[i], w[i + 1]).is_some_and(round) && float(w[i + 1], w[i]).is_some_and(round)
        };
        let accidental = (0..w.len().saturating_sub(1)).any(|i| {
            if planted.contains(&(i as u16)) {
                // The planted float's words read as a round float the other way round too.
                both(i)
            } else {
                float(w[i], w[i + 1]).is_some_and(round) || float(w[i + 1], w[i]).is_some_and(round)
            }
        });
        // Or an integer whose bytes read as characters: text may take it in.
        let in_text: Vec<bool> = items.iter().flat_map(|it| match it {
            Item::Text(s) => vec![true; text(s).len()],
            Item::Float(..) => vec![false; 2],
            _ => vec![false],
        }).collect();
        let accidental = accidental || w.iter().zip(&in_text).any(|(x, t)| {
            let [a, b] = x.to_be_bytes();
            !t && printable(a) && (printable(b) || b == 0)
        });
        if !accidental {
            prop_assert_eq!(got, want);
        }
    }
}
