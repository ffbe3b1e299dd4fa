//! `hourglass sketch build | merge | inspect`, end to end through the binary.

use crate::util::{TempDir, hourglass, lines};
use serde_json::Value;

fn keys(v: &Value) -> Vec<String> {
    let mut k: Vec<String> = v.as_object().expect("object").keys().cloned().collect();
    k.sort();
    k
}

#[test]
fn distinct_counts_lines_within_its_interval() {
    let dir = TempDir::new("distinct");
    let out = dir.file("users.hgs");
    // 50,000 lines, 20,000 distinct, with Windows line endings on some: \r\n is one line end.
    let mut input = lines("user", 0..20_000);
    input.extend(lines("user", 0..20_000));
    input.extend(
        (0..10_000u64)
            .flat_map(|i| format!("user{i}\r\n").into_bytes())
            .collect::<Vec<u8>>(),
    );
    hourglass(
        &["sketch", "build", "--kind", "distinct", "-o", &out],
        &input,
    )
    .ok();
    let v = hourglass(&["sketch", "inspect", &out, "--json"], b"")
        .ok()
        .json();
    assert_eq!(
        keys(&v),
        [
            "estimate",
            "form",
            "kind",
            "lower95",
            "std_error",
            "upper95"
        ]
    );
    assert_eq!(v["kind"], "distinct");
    assert_eq!(v["form"], "hll", "the command's default form");
    let (est, se) = (
        v["estimate"].as_f64().unwrap(),
        v["std_error"].as_f64().unwrap(),
    );
    // Standard error at p=14 is 0.81%; 4σ makes a false failure a 1-in-15,000 event.
    assert!((est - 20_000.0).abs() <= 4.0 * se, "estimate {est} ± {se}");
    assert!(
        (se / est - 0.0081).abs() < 0.0005,
        "relative error {}",
        se / est
    );
    assert!(v["lower95"].as_f64().unwrap() < 20_000.0 && v["upper95"].as_f64().unwrap() > 20_000.0);

    let human = hourglass(&["sketch", "inspect", &out], b"").ok().text();
    assert!(
        human.contains("distinct (HyperLogLog, precision 14, dense)"),
        "{human}"
    );
    assert!(human.contains(" ± 0.81% (95%: "), "{human}");
}

/// `--form ull` builds an UltraLogLog: its smaller error bar, its name in `inspect`, and
/// a merge with a HyperLogLog that is the HyperLogLog of the union.
#[test]
fn ull_form_builds_merges_and_describes_itself() {
    let dir = TempDir::new("ull");
    let (ull, hll, merged, whole) = (
        dir.file("u.hgs"),
        dir.file("h.hgs"),
        dir.file("m.hgs"),
        dir.file("w.hgs"),
    );
    hourglass(
        &[
            "sketch", "build", "--kind", "distinct", "--form", "ull", "-o", &ull,
        ],
        &lines("user", 0..20_000),
    )
    .ok();
    let v = hourglass(&["sketch", "inspect", &ull, "--json"], b"")
        .ok()
        .json();
    assert_eq!(v["form"], "ull");
    let (est, se) = (
        v["estimate"].as_f64().unwrap(),
        v["std_error"].as_f64().unwrap(),
    );
    assert!((est - 20_000.0).abs() <= 4.0 * se, "estimate {est} ± {se}");
    // At ull's default precision 13: 0.761/√8192 = 0.84%.
    assert!(
        (se / est - 0.00841).abs() < 0.0004,
        "relative error {}",
        se / est
    );
    let human = hourglass(&["sketch", "inspect", &ull], b"").ok().text();
    assert!(
        human.contains("distinct (UltraLogLog, precision 13, dense)"),
        "{human}"
    );
    assert!(human.contains("8,216 bytes encoded"), "{human}");

    // UltraLogLog ∪ HyperLogLog (p = 12) is the HyperLogLog of the union at p = 12.
    let build_hll = |input: &[u8], out: &str| {
        hourglass(
            &[
                "sketch",
                "build",
                "--kind",
                "distinct",
                "--form",
                "hll",
                "--precision",
                "12",
                "-o",
                out,
            ],
            input,
        )
        .ok();
    };
    build_hll(&lines("user", 10_000..30_000), &hll);
    hourglass(&["sketch", "merge", &ull, &hll, "-o", &merged], b"").ok();
    let mut all = lines("user", 0..20_000);
    all.extend(lines("user", 10_000..30_000));
    build_hll(&all, &whole);
    assert_eq!(
        std::fs::read(&merged).unwrap(),
        std::fs::read(&whole).unwrap()
    );
    let v = hourglass(&["sketch", "inspect", &merged, "--json"], b"")
        .ok()
        .json();
    assert_eq!(v["form"], "hll");

    // clap's own message (with its usage hint), naming the flag and the forms.
    let run = hourglass(
        &[
            "sketch", "build", "--kind", "distinct", "--form", "ultra", "-o", &ull,
        ],
        b"",
    );
    assert!(!run.status.success());
    assert!(
        run.stderr.contains("--form")
            && run
                .stderr
                .contains("expected \"hll\" (HyperLogLog) or \"ull\""),
        "{}",
        run.stderr
    );
    fails_with(
        &[
            "sketch",
            "build",
            "--kind",
            "frequency",
            "--form",
            "ull",
            "-o",
            &ull,
        ],
        b"",
        "--form applies to --kind distinct",
    );
}

#[test]
fn small_counts_are_exact() {
    let v = {
        let dir = TempDir::new("small");
        let out = dir.file("s.hgs");
        hourglass(
            &[
                "sketch",
                "build",
                "--kind",
                "distinct",
                "--precision",
                "10",
                "-o",
                &out,
            ],
            &lines("x", 0..73),
        )
        .ok();
        hourglass(&["sketch", "inspect", &out, "--json"], b"")
            .ok()
            .json()
    };
    assert_eq!(v["estimate"].as_f64().unwrap().round(), 73.0);
}

#[test]
fn merge_of_parts_equals_the_sketch_of_the_whole() {
    let dir = TempDir::new("merge");
    let (a, b, whole, merged) = (
        dir.file("a"),
        dir.file("b"),
        dir.file("whole"),
        dir.file("merged"),
    );
    for kind_args in [
        &["--kind", "distinct", "--precision", "12"][..],
        &["--kind", "frequency", "--epsilon", "0.01"][..],
        &["--kind", "membership", "--capacity", "5000"][..],
    ] {
        let build = |input: &[u8], out: &str| {
            let mut args = vec!["sketch", "build"];
            args.extend_from_slice(kind_args);
            args.extend_from_slice(&["-o", out]);
            hourglass(&args, input).ok();
        };
        build(&lines("i", 0..3000), &a);
        build(&lines("i", 2000..6000), &b);
        let mut all = lines("i", 0..3000);
        all.extend(lines("i", 2000..6000));
        build(&all, &whole);
        hourglass(&["sketch", "merge", &a, &b, "-o", &merged], b"").ok();
        let (m, w) = (
            std::fs::read(&merged).unwrap(),
            std::fs::read(&whole).unwrap(),
        );
        if kind_args[1] == "frequency" {
            // The Count-Min part is exactly the sketch of the union; the frequent-items
            // part may purge at other points, so compare answers instead.
            let q = |f: &str| {
                hourglass(&["sketch", "inspect", f, "--item", "i2500", "--json"], b"")
                    .ok()
                    .json()
            };
            assert_eq!(q(&merged)["estimate"], q(&whole)["estimate"]);
            assert_eq!(q(&merged)["total"], 7000);
        } else {
            assert_eq!(
                m, w,
                "{kind_args:?}: merge differs from the sketch of the union"
            );
        }
    }
    // Stdout when no -o: the same bytes.
    let piped = hourglass(&["sketch", "merge", &a, &b], b"").ok().stdout;
    assert_eq!(piped, std::fs::read(&merged).unwrap());
}

#[test]
fn frequency_answers_items_and_top_k() {
    let dir = TempDir::new("freq");
    let out = dir.file("pages.hgs");
    let mut input = Vec::new();
    for (page, times) in [("/cart", 500), ("/home", 300), ("/about", 20)] {
        for _ in 0..times {
            input.extend_from_slice(format!("{page}\n").as_bytes());
        }
    }
    input.extend(lines("/product/", 0..2000));
    hourglass(
        &["sketch", "build", "--kind", "frequency", "-o", &out],
        &input,
    )
    .ok();

    let v = hourglass(
        &["sketch", "inspect", &out, "--item", "/cart", "--json"],
        b"",
    )
    .ok()
    .json();
    assert_eq!(
        keys(&v),
        ["estimate", "item", "kind", "max_overcount", "total"]
    );
    assert_eq!(v["item"], "/cart");
    assert_eq!(v["total"], 2820);
    let (est, over) = (
        v["estimate"].as_u64().unwrap(),
        v["max_overcount"].as_u64().unwrap(),
    );
    assert!(
        (500..=500 + over).contains(&est),
        "estimate {est}, bound {over}"
    );
    assert_eq!(over, 3, "ε·N = (e/2719) × 2820 = 2.82, rounded up");

    let v = hourglass(&["sketch", "inspect", &out, "--k", "2", "--json"], b"")
        .ok()
        .json();
    let items = v["items"].as_array().unwrap();
    assert_eq!(items.len(), 2);
    assert_eq!(items[0]["item"], "/cart");
    assert_eq!(items[1]["item"], "/home");
    for it in items {
        let mut k: Vec<&String> = it.as_object().unwrap().keys().collect();
        k.sort();
        assert_eq!(k, ["estimate", "item", "lower", "upper"]);
        assert!(it["lower"].as_u64() <= it["estimate"].as_u64());
        assert!(it["estimate"].as_u64() <= it["upper"].as_u64());
    }
    assert!(
        items[1]["lower"].as_u64().unwrap() <= 300 && 300 <= items[1]["upper"].as_u64().unwrap()
    );

    let human = hourglass(&["sketch", "inspect", &out, "--k", "3"], b"")
        .ok()
        .text();
    assert!(
        human.contains("top 3 items:") && human.contains("\"/cart\""),
        "{human}"
    );
}

#[test]
fn membership_says_maybe_or_definitely_not() {
    let dir = TempDir::new("member");
    let out = dir.file("seen.hgs");
    hourglass(
        &[
            "sketch",
            "build",
            "--kind",
            "membership",
            "--capacity",
            "1000",
            "--fpr",
            "0.001",
            "-o",
            &out,
        ],
        &lines("user", 0..800),
    )
    .ok();
    let v = hourglass(
        &["sketch", "inspect", &out, "--item", "user42", "--json"],
        b"",
    )
    .ok()
    .json();
    assert_eq!(
        keys(&v),
        ["estimated_fpr", "fill_ratio", "kind", "maybe_present"]
    );
    assert_eq!(v["maybe_present"], true);
    let fpr = v["estimated_fpr"].as_f64().unwrap();
    assert!(fpr > 0.0 && fpr < 0.001, "fpr {fpr}");
    // With a 0.04% false-positive rate, 20 absent items all answering "maybe" would be a
    // (4e-4)^20 event; at least 19 must be definite noes.
    let absent = (0..20)
        .filter(|i| {
            let item = format!("stranger{i}");
            let v = hourglass(&["sketch", "inspect", &out, "--item", &item, "--json"], b"")
                .ok()
                .json();
            v["maybe_present"] == false
        })
        .count();
    assert!(
        absent >= 19,
        "only {absent} of 20 absent items were definite noes"
    );
    let v = hourglass(&["sketch", "inspect", &out, "--json"], b"")
        .ok()
        .json();
    assert_eq!(keys(&v), ["estimated_fpr", "fill_ratio", "kind"]);
}

#[test]
fn an_overfull_filter_warns() {
    let dir = TempDir::new("overfull");
    let out = dir.file("full.hgs");
    hourglass(
        &[
            "sketch",
            "build",
            "--kind",
            "membership",
            "--capacity",
            "100",
            "-o",
            &out,
        ],
        &lines("u", 0..300),
    )
    .ok();
    let human = hourglass(&["sketch", "inspect", &out], b"").ok().text();
    assert!(human.contains("past its design point"), "{human}");
    let json_run = hourglass(&["sketch", "inspect", &out, "--json"], b"").ok();
    assert!(
        json_run
            .stderr
            .contains("warning: membership sketch is past its design point"),
        "{}",
        json_run.stderr
    );
}

fn fails_with(args: &[&str], stdin: &[u8], needle: &str) {
    let run = hourglass(args, stdin);
    assert!(!run.status.success(), "{args:?} succeeded");
    let line = run.stderr.trim_end();
    assert!(
        line.contains(needle),
        "{args:?}: stderr {line:?} lacks {needle:?}"
    );
    assert_eq!(line.lines().count(), 1, "{args:?}: not one line: {line:?}");
}

#[test]
fn bad_input_is_one_clear_line_and_a_failure() {
    let dir = TempDir::new("errors");
    let (d, f, junk) = (dir.file("d"), dir.file("f"), dir.file("junk"));
    hourglass(&["sketch", "build", "--kind", "distinct", "-o", &d], b"a\n").ok();
    hourglass(
        &["sketch", "build", "--kind", "frequency", "-o", &f],
        b"a\n",
    )
    .ok();
    std::fs::write(&junk, b"not a sketch at all").unwrap();
    let missing = dir.file("missing");
    fails_with(&["sketch", "inspect", &missing], b"", "cannot read");
    fails_with(&["sketch", "inspect", &junk], b"", "not a valid sketch");
    fails_with(
        &["sketch", "merge", &d, &f],
        b"",
        "cannot merge a frequency sketch into a distinct sketch",
    );
    fails_with(
        &["sketch", "build", "--kind", "membership", "-o", &d],
        b"",
        "needs --capacity",
    );
    fails_with(
        &[
            "sketch",
            "build",
            "--kind",
            "distinct",
            "--precision",
            "20",
            "-o",
            &d,
        ],
        b"",
        "precision",
    );
    fails_with(
        &[
            "sketch",
            "build",
            "--kind",
            "distinct",
            "--epsilon",
            "0.1",
            "-o",
            &d,
        ],
        b"",
        "--epsilon/--delta applies to --kind frequency",
    );
    fails_with(
        &["sketch", "inspect", &d, "--item", "x"],
        b"",
        "--item does not apply",
    );

    // Distinct sketches of different precisions merge at the smaller one.
    let d12 = dir.file("d12");
    hourglass(
        &[
            "sketch",
            "build",
            "--kind",
            "distinct",
            "--precision",
            "12",
            "-o",
            &d12,
        ],
        b"b\n",
    )
    .ok();
    let merged = dir.file("m");
    hourglass(&["sketch", "merge", &d, &d12, "-o", &merged], b"").ok();
    let v = hourglass(&["sketch", "inspect", &merged, "--json"], b"")
        .ok()
        .json();
    assert_eq!(v["estimate"].as_f64().unwrap().round(), 2.0);

    // A corrupted byte is caught by the checksum and named.
    let mut bytes = std::fs::read(&d).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x40;
    std::fs::write(&junk, &bytes).unwrap();
    fails_with(&["sketch", "inspect", &junk], b"", "checksum mismatch");
}
