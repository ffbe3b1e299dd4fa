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

use anyhow::bail;
use hourglass_rpc::proto::v1;
use hourglass_rpc::selection::{Spelling, VsSelection};
use serde_json::{Value, json};

use super::numbers::{count, grouped, percent};
use super::query::{
    QueryArgs, Question, coverage_fields, describe, describe_selection, distinct_text,
    distinct_value, missing_text, partitions_text,
};

/// Refuses flags that do not belong to `question`, before anything is asked. Returns the
/// hours of retention's `--period` (0 for the other questions).
pub(crate) fn check_flags(
    question: Question,
    vs: &VsSelection,
    period: Option<&str>,
    grouped_by: bool,
) -> anyhow::Result<u32> {
    let name = super::query::question_name(question);
    if matches!(question, Question::Overlap | Question::Retention) && grouped_by {
        bail!("--group-by does not apply to query {name}: it compares whole selections");
    }
    if question != Question::Overlap && !vs.is_empty() {
        bail!("the --vs-* flags apply to query overlap only, not query {name}");
    }
    if question == Question::Overlap && vs.is_empty() {
        bail!(
            "query overlap needs at least one --vs-* flag: selection B is the selection with them (e.g. --vs-from -14d --vs-to -7d, or --vs-server 'api-*')"
        );
    }
    if question != Question::Retention && period.is_some() {
        bail!("--period applies to query retention only, not query {name}");
    }
    if question == Question::Retention {
        return period_hours(period);
    }
    Ok(0)
}

/// The hours of `--period`.
pub(crate) fn period_hours(period: Option<&str>) -> anyhow::Result<u32> {
    let Some(text) = period else {
        bail!("query retention needs --period day, week or Nh (the length of a cohort)");
    };
    hourglass_rpc::selection::parse_period(text).map_err(|e| anyhow::anyhow!("--period {e}"))
}

/// Selection B's wire selector; an error names the `--vs-*` flag at fault.
pub(crate) fn b_selector(
    args: &QueryArgs,
    now: chrono::DateTime<chrono::Utc>,
) -> anyhow::Result<v1::Selector> {
    if let Some(metric) = &args.vs.metric {
        hourglass_rpc::series::validate_metric(metric)
            .map_err(|e| anyhow::anyhow!("--vs-metric: {e}"))?;
    }
    args.vs
        .selector(&args.selection, now, Spelling::Flags)
        .map_err(|e| anyhow::anyhow!("selection B: {e}"))
}

/// An estimate as JSON ([`hourglass_rpc::json_figure`]: an unbounded figure is the
/// largest finite number).
pub(crate) fn estimate_value(a: Option<&v1::DistinctAnswer>) -> Value {
    use hourglass_rpc::json_figure;
    let a = a.cloned().unwrap_or_default();
    json!({
        "estimate": json_figure(a.estimate),
        "std_error": json_figure(a.std_error),
        "lower95": json_figure(a.lower95),
        "upper95": json_figure(a.upper95),
    })
}

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
    let mut text = format!(
        "{}, periods of {period_hours} hours\n",
        describe_selection(args)
    );
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

fn u(v: &Value, key: &str) -> u64 {
    v[key].as_u64().unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn period_errors_name_the_flag() {
        assert_eq!(period_hours(Some("week")).unwrap(), 168);
        let e = period_hours(Some("month")).unwrap_err().to_string();
        assert!(e.starts_with("--period \"month\": expected"), "{e}");
        assert!(period_hours(None).is_err());
    }

    #[test]
    fn flags_of_another_question_are_refused() {
        let vs = VsSelection {
            from: Some("-14d".into()),
            ..VsSelection::default()
        };
        assert!(check_flags(Question::Distinct, &vs, None, false).is_err());
        assert!(check_flags(Question::Overlap, &VsSelection::default(), None, false).is_err());
        assert!(check_flags(Question::Overlap, &vs, None, false).is_ok());
        assert!(check_flags(Question::Overlap, &vs, Some("day"), false).is_err());
        assert!(check_flags(Question::Retention, &VsSelection::default(), None, false).is_err());
        assert!(
            check_flags(
                Question::Retention,
                &VsSelection::default(),
                Some("week"),
                false
            )
            .is_ok()
        );
        assert!(check_flags(Question::Overlap, &vs, None, true).is_err());
    }
}
