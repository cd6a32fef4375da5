use std::sync::Arc;

use rand::{Rng, SeedableRng};

use super::utf8::{CharClass, Step};
use super::{Matcher, Program, VocabTrie};

/// `root ::= ( [a-c] | "é" )* "!"` as a program: rule 0 = [star-ref, "!"],
/// rule 1 = star: ([a-c] star | "é" star | "").
fn program() -> Arc<Program> {
    let words = [
        2, 0, // two rules, root 0
        1, 2, 1, 1, 0, 1, 0x21, 0x21, // root: one alt, [ref 1, '!']
        3,    // rule 1: three alts
        2, 0, 1, 0x61, 0x63, 1, 1, // [a-c] ref 1
        2, 0, 1, 0xE9, 0xE9, 1, 1, // é ref 1
        0, // ""
    ];
    Arc::new(Program::decode(&words).expect("valid program"))
}

fn vocab() -> Arc<VocabTrie> {
    let pieces: Vec<Vec<u8>> = [
        "a", "b", "ab", "abc", "d", "!", "a!", "é", "\u{e9}a", "!a", "<eos>",
    ]
    .iter()
    .map(|s| s.as_bytes().to_vec())
    .chain([vec![0xC3], vec![0xA9, b'!']]) // é split across two tokens
    .collect();
    let n = pieces.len();
    let mut special = vec![false; n];
    special[10] = true;
    Arc::new(VocabTrie::new(pieces, special, vec![10]))
}

fn mask(m: &mut Matcher, n: usize) -> Vec<bool> {
    let mut bits = vec![0u64; n.div_ceil(64)];
    m.fill_mask(&mut bits).expect("mask");
    (0..n).map(|i| bits[i / 64] >> (i % 64) & 1 == 1).collect()
}

#[test]
fn mask_equals_trying_every_token() {
    let trie = vocab();
    let n = trie.n_vocab();
    let mut m = Matcher::new(program(), Arc::clone(&trie)).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    for _ in 0..40 {
        let want: Vec<bool> = (0..n as u32)
            .map(|t| {
                let ok = m.accept_token(t).unwrap();
                if ok {
                    m.rollback(1).unwrap();
                }
                ok
            })
            .collect();
        assert_eq!(mask(&mut m, n), want);
        let allowed: Vec<u32> = (0..n as u32).filter(|&t| want[t as usize]).collect();
        if allowed.is_empty() || m.is_terminated() {
            m.reset();
            continue;
        }
        let t = allowed[rng.random_range(0..allowed.len())];
        assert!(m.accept_token(t).unwrap());
    }
}

#[test]
fn eos_only_where_the_grammar_ends() {
    let mut m = Matcher::new(program(), vocab()).unwrap();
    assert!(!m.accept_token(10).unwrap());
    assert!(m.accept_token(3).unwrap()); // "abc"
    assert!(!m.is_accepting());
    assert!(m.accept_token(11).unwrap()); // first byte of é
    assert!(m.accept_token(12).unwrap()); // rest of é, then "!"
    assert!(m.is_accepting() && m.is_terminated());
    assert!(m.accept_token(10).unwrap());
    m.rollback(3).unwrap();
    assert!(!m.is_accepting());
    assert!(m.rollback(5).is_err());
}

#[test]
fn state_round_trips_and_garbage_is_refused() {
    let mut m = Matcher::new(program(), vocab()).unwrap();
    m.accept_token(0).unwrap();
    m.accept_token(11).unwrap(); // mid-character
    let st = m.export_state();
    let mut fresh = Matcher::new(program(), vocab()).unwrap();
    fresh.import_state(&st).unwrap();
    assert_eq!(mask(&mut fresh, 13), mask(&mut m, 13));
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    for _ in 0..2000 {
        let mut w = st.clone();
        let i = rng.random_range(0..w.len());
        w[i] = rng.random();
        if rng.random_bool(0.3) {
            w.truncate(rng.random_range(0..w.len()));
        }
        if fresh.import_state(&w).is_ok() {
            let _ = mask(&mut fresh, 13); // whatever it is, it must not panic
        }
    }
}

#[test]
fn random_programs_never_panic() {
    let good = [2u32, 0, 1, 2, 1, 1, 0, 1, 0x21, 0x21, 1, 0];
    assert!(Program::decode(&good).is_ok());
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);
    for _ in 0..5_000 {
        let mut w = good.to_vec();
        for _ in 0..rng.random_range(1..4) {
            let i = rng.random_range(0..w.len());
            w[i] = if rng.random_bool(0.5) {
                rng.random_range(0..8)
            } else {
                rng.random()
            };
        }
        if let Ok(p) = Program::decode(&w) {
            // A valid-looking program may still be left-recursive; the
            // matcher must end in an error, not loop or overflow.
            if let Ok(mut m) = Matcher::new(Arc::new(p), vocab()) {
                let _ = m.accept_token(0);
                let mut bits = vec![0u64; 1];
                let _ = m.fill_mask(&mut bits);
            }
        }
    }
}

#[test]
fn left_recursion_ends_in_an_error() {
    // root ::= root "a" | "a"
    let words = [1u32, 0, 2, 2, 1, 0, 0, 1, 0x61, 0x61, 1, 0, 1, 0x61, 0x61];
    let p = Arc::new(Program::decode(&words).unwrap());
    assert!(Matcher::new(p, vocab()).is_err());
}

#[test]
fn utf8_classes_match_code_points_exactly() {
    let class = CharClass::new(vec![
        (0x41, 0x5A),
        (0xE9, 0xE9),
        (0x4E00, 0x4E01),
        (0x1F600, 0x1F600),
    ]);
    for cp in [
        0x41u32, 0x5A, 0xE9, 0x4E00, 0x4E01, 0x1F600, 0x40, 0xEA, 0x4E02, 0x1F601,
    ] {
        let s = char::from_u32(cp).unwrap().to_string();
        let mut sub = 0;
        let mut done = false;
        for (i, &b) in s.as_bytes().iter().enumerate() {
            match class.step(sub, b) {
                Step::Done => {
                    done = i + 1 == s.len();
                    break;
                }
                Step::More(s2) => sub = s2,
                Step::Dead => break,
            }
        }
        assert_eq!(done, class.contains(cp), "{cp:#x}");
    }
    // Overlong, surrogate and out-of-range encodings never match.
    let any = CharClass::new(vec![(0, 0x10_FFFF)]);
    for bad in [
        &[0xC0u8, 0x80][..],
        &[0xE0, 0x80, 0x80],
        &[0xED, 0xA0, 0x80],
        &[0xF4, 0x90, 0x80, 0x80],
    ] {
        let mut sub = 0;
        let mut ok = false;
        for &b in bad {
            match any.step(sub, b) {
                Step::Done => ok = true,
                Step::More(s) => sub = s,
                Step::Dead => break,
            }
        }
        assert!(!ok, "{bad:x?}");
    }
}

/// Runs a byte string through a class; `Some(true)` when exactly the whole
/// string completes one code point of it.
fn class_accepts(class: &CharClass, bytes: &[u8]) -> bool {
    let mut sub = 0;
    for (i, &b) in bytes.iter().enumerate() {
        match class.step(sub, b) {
            Step::Done => return i + 1 == bytes.len(),
            Step::More(s) => sub = s,
            Step::Dead => return false,
        }
    }
    false
}

fn reference_accepts(class: &CharClass, bytes: &[u8]) -> bool {
    match std::str::from_utf8(bytes) {
        Ok(s) => {
            let mut chars = s.chars();
            matches!((chars.next(), chars.next()), (Some(c), None) if class.contains(c as u32))
        }
        Err(_) => false,
    }
}

/// The collapsed (`ANY`) sub-states must not change what a class accepts:
/// every 1-, 2- and 3-byte string, and 4-byte strings over the lead and
/// boundary bytes, against std's UTF-8 decoder.
#[test]
fn utf8_class_steps_agree_with_std_decoding() {
    let classes = [
        // A JSON string body: everything but `"`, `\` and controls.
        CharClass::new(vec![(0x20, 0x21), (0x23, 0x5B), (0x5D, 0x10_FFFF)]),
        // Ranges that split lead-byte blocks and the surrogate boundary.
        CharClass::new(vec![(0x41, 0x5A), (0x4E00, 0x9FFF), (0xD000, 0xD7FF)]),
        CharClass::new(vec![(0x7FF, 0x801), (0xE000, 0xFFFF), (0x10000, 0x1FFFF)]),
        CharClass::new(vec![(0, 0x10_FFFF)]),
    ];
    let edge = [
        0x00u8, 0x7F, 0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF, 0xC0, 0xC1, 0xC2, 0xDF, 0xE0, 0xE1, 0xEC,
        0xED, 0xEE, 0xEF, 0xF0, 0xF1, 0xF3, 0xF4, 0xF5, 0xFF,
    ];
    for class in &classes {
        for a in 0..=255u8 {
            assert_eq!(class_accepts(class, &[a]), reference_accepts(class, &[a]));
            for b in 0..=255u8 {
                let two = [a, b];
                assert_eq!(class_accepts(class, &two), reference_accepts(class, &two));
                if (0xE0..=0xEF).contains(&a) {
                    for c in 0..=255u8 {
                        let three = [a, b, c];
                        assert_eq!(
                            class_accepts(class, &three),
                            reference_accepts(class, &three),
                            "{three:x?}"
                        );
                    }
                }
            }
        }
        for &a in &edge {
            for &b in &edge {
                for &c in &edge {
                    for &d in &edge {
                        let four = [a, b, c, d];
                        assert_eq!(
                            class_accepts(class, &four),
                            reference_accepts(class, &four),
                            "{four:x?}"
                        );
                    }
                }
            }
        }
    }
    // The point of `ANY`: a class holding all of a lead byte's code points
    // reaches one sub-state per (length, remaining) whatever the lead.
    let body = &classes[0];
    let mut subs = std::collections::BTreeSet::new();
    for lead in [0xC3u8, 0xD0, 0xE4, 0xE8, 0xEA, 0xF1, 0xF2] {
        if let Step::More(s) = body.step(0, lead) {
            subs.insert(s);
        }
    }
    assert_eq!(subs.len(), 3, "{subs:x?}");
}

#[test]
fn shortest_completion_counts_tokens_and_its_path_keeps_the_budget() {
    let trie = vocab();
    let mut m = Matcher::new(program(), Arc::clone(&trie)).unwrap();
    // From the start the shortest text is "!", one token.
    assert_eq!(m.min_completion_tokens(), Some(1));
    let toks = m.shortest_path_tokens(1).expect("a path");
    assert_eq!(toks, vec![5]); // "!"
    assert!(m.accept_token(0).unwrap()); // "a"
    assert_eq!(m.min_completion_tokens(), Some(1));
    // Half of "é": one continuation byte, then "!" (the two-byte token
    // 0xA9 "!" spells both).
    assert!(m.accept_token(11).unwrap());
    assert_eq!(m.min_completion_tokens(), None); // mid-character: not spelled
    assert!(m.accept_token(12).unwrap());
    assert!(m.is_accepting());
    assert_eq!(m.min_completion_tokens(), Some(0));
    let end = m.shortest_path_tokens(0).expect("the end");
    assert!(end.contains(&10));
}

#[test]
fn segment_counts_take_the_fewest_tokens() {
    let trie = vocab();
    let c = super::shortest::segment_counts(&trie, b"abca!");
    // "abc" + "a!" is two tokens; "ab" + ... needs more.
    assert_eq!(c[0], 2);
    assert_eq!(c[3], 1);
    assert_eq!(c[5], 0);
    assert_eq!(
        super::shortest::segment_counts(&trie, b"z")[0],
        super::shortest::INF
    );
}
