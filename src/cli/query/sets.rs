//! `hourglass query overlap | retention`: set questions over distinct sketches.
//!
//! `overlap` compares the selection its flags make (A) with B, which is A with what the
//! `--vs-*` flags replace: `--vs-from -14d --vs-to -7d` compares with the week before,
//! `--vs-server 'api-*'` with other servers. `retention` cuts the range into `--period`s
//! and compares each period's items with every later period's.
//!
//! `--json` keys: overlap prints `a`, `b` (each a distinct answer with its coverage, as
//! `query distinct --json` prints one), `union`, `intersection`, `only_a`, `only_b`,
//! `jaccard`, `retained` (each `estimate`, `std_error`, `lower95`, `upper95`), `verdict`
//! (`estimable`, `too_small`, `empty`, `saturated`) and `naive_intersection`; retention
//! prints `periods` (each `start`, `end`, a distinct answer and its coverage) and `rows`
//! (each `cohort`, the index of its period, and `cells`: `period`, `returned`, `share`,
//! `verdict`).

use hourglass_rpc::proto::v1;
use serde_json::{Value, json};

use super::answer::{
    coverage_fields, distinct_text, distinct_value, estimate_value, missing_text, partitions_text,
    u,
};
use super::args::{QueryArgs, describe, describe_selection};
use crate::cli::numbers::{count, grouped, percent};

/// A fraction with its interval: `41.2% (95%: 39.0% – 43.4%)`.
fn share_text(v: &Value) -> String {
    let f = |key: &str| v[key].as_f64().unwrap_or(0.0);
    if hourglass_rpc::is_unbounded(f("std_error")) {
        return format!(
            "between {} and {} (the sketches cannot say)",
            percent(f("lower95")),
            percent(f("upper95"))
        );
    }
    format!(
        "{} (95%: {} – {})",
        percent(f("estimate")),
        percent(f("lower95")),
        percent(f("upper95"))
    )
}

/// The overlap reply as JSON and as text.
pub(crate) fn present_overlap(args: &QueryArgs, reply: &v1::OverlapResponse) -> (Value, String) {
    let answer = reply.answer.unwrap_or_default();
    let a = distinct_value(answer.a.as_ref(), reply.coverage_a.as_ref());
    let b = distinct_value(answer.b.as_ref(), reply.coverage_b.as_ref());
    let value = json!({
        "a": a,
        "b": b,
        "union": estimate_value(answer.union.as_ref()),
        "intersection": estimate_value(answer.intersection.as_ref()),
        "only_a": estimate_value(answer.only_a.as_ref()),
        "only_b": estimate_value(answer.only_b.as_ref()),
        "jaccard": estimate_value(answer.jaccard.as_ref()),
        "retained": estimate_value(answer.retained.as_ref()),
        "verdict": hourglass_rpc::proto::overlap_verdict_name(answer.verdict),
        "naive_intersection": hourglass_rpc::json_figure(answer.naive_intersection),
    });
    let b_selection = args.vs.apply(&args.selection);
    let mut text = format!(
        "overlap of\n  A: {}\n  B: {}\n",
        describe(&args.selection),
        describe(&b_selection)
    );
    let rows = [
        ("A", distinct_text(&value["a"])),
        ("B", distinct_text(&value["b"])),
        ("A ∪ B", distinct_text(&value["union"])),
        ("A ∩ B", distinct_text(&value["intersection"])),
        ("A only", distinct_text(&value["only_a"])),
        ("B only", distinct_text(&value["only_b"])),
        ("Jaccard", share_text(&value["jaccard"])),
        ("A ∩ B / A", share_text(&value["retained"])),
    ];
    for (name, answer) in rows {
        text += &format!("  {name:<10} {answer}\n");
    }
    match v1::OverlapVerdict::try_from(answer.verdict) {
        Ok(v1::OverlapVerdict::TooSmall) => {
            text += &format!(
                "warning: A ∩ B is too small beside A ∪ B for these sketches to tell from zero: read it as at most {}, not as its estimate\n",
                count(answer.intersection.unwrap_or_default().upper95)
            );
        }
        Ok(v1::OverlapVerdict::Saturated) => {
            text += "warning: a sketch is saturated: the sets are beyond what the sketches can measure\n";
        }
        _ => {}
    }
    text += &format!(
        "merged {} sketches for A, {} for B\n",
        grouped(u(&a, "sketches_merged")),
        grouped(u(&b, "sketches_merged"))
    );
    for (name, side) in [("A", &a), ("B", &b)] {
        for warning in [missing_text(side), partitions_text(side)]
            .into_iter()
            .flatten()
        {
            text += &format!("warning: {name}: {warning}\n");
        }
    }
    (value, text)
}

/// The retention reply as JSON and as text.
pub(crate) fn present_retention(
    args: &QueryArgs,
    period_hours: u32,
    reply: &v1::RetentionResponse,
) -> (Value, String) {
    let periods: Vec<Value> = reply
        .periods
        .iter()
        .map(|p| {
            let mut v = estimate_value(p.distinct.as_ref());
            v["start"] = json!(hourglass_rpc::time::rfc3339_hour(p.start_hour));
            v["end"] = json!(hourglass_rpc::time::rfc3339_hour(p.end_hour));
            coverage_fields(&mut v, p.coverage.as_ref());
            v
        })
        .collect();
    let rows: Vec<Value> = reply
        .rows
        .iter()
        .map(|r| {
            json!({
                "cohort": r.cohort,
                "cells": r.cells.iter().map(|c| json!({
                    "period": c.period,
                    "returned": estimate_value(c.returned.as_ref()),
                    "share": estimate_value(c.share.as_ref()),
                    "verdict": hourglass_rpc::proto::overlap_verdict_name(c.verdict),
                })).collect::<Vec<_>>(),
            })
        })
        .collect();
    let period = hourglass_rpc::time::hours_text(period_hours);
    let mut text = format!("{}, periods of {period}\n", describe_selection(args, None));
    // One line per cohort: its start, its size, then its share seen again in each later
    // period; a share too small to tell from zero shows as `<` its upper bound.
    let later = periods.len().saturating_sub(1);
    text += &format!("  {:<18} {:>12}", "cohort", "size");
    for k in 1..=later {
        text += &format!(" {:>10}", format!("+{k}"));
    }
    text += "\n";
    for (i, period) in periods.iter().enumerate() {
        text += &format!(
            "  {:<18} {:>12}",
            period["start"].as_str().unwrap_or(""),
            count(period["estimate"].as_f64().unwrap_or(0.0))
        );
        if let Some(row) = reply.rows.iter().find(|r| r.cohort as usize == i) {
            for cell in &row.cells {
                let share = cell.share.unwrap_or_default();
                let shown = match v1::OverlapVerdict::try_from(cell.verdict) {
                    Ok(v1::OverlapVerdict::TooSmall) => format!("<{}", percent(share.upper95)),
                    _ => percent(share.estimate),
                };
                text += &format!(" {shown:>10}");
            }
        }
        text += "\n";
    }
    let merged: u64 = periods.iter().map(|p| u(p, "sketches_merged")).sum();
    text += &format!(
        "shares are of each cohort seen again k periods later (±{} typical); merged {} sketches\n",
        typical_share_error(reply),
        grouped(merged)
    );
    for period in &periods {
        for warning in [missing_text(period), partitions_text(period)]
            .into_iter()
            .flatten()
        {
            text += &format!(
                "warning: {}: {warning}\n",
                period["start"].as_str().unwrap_or("")
            );
        }
    }
    (json!({"periods": periods, "rows": rows}), text)
}

/// The median standard error of the table's shares, as a percentage.
fn typical_share_error(reply: &v1::RetentionResponse) -> String {
    let mut errors: Vec<f64> = reply
        .rows
        .iter()
        .flat_map(|r| &r.cells)
        .filter_map(|c| c.share.as_ref().map(|s| s.std_error))
        .collect();
    if errors.is_empty() {
        return percent(0.0);
    }
    errors.sort_by(f64::total_cmp);
    percent(errors[errors.len() / 2])
}
