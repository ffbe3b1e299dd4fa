//! An aggregator's answer as `hourglass query` prints it: one JSON object (the keys
//! `hourglass sketch inspect --json` prints, with the coverage and the groups) or text
//! under a header, with its error bars and the coverage's warnings.

use hourglass_rpc::proto::v1;
use serde_json::{Value, json};

use crate::cli::numbers::{count, grouped, item_width, percent};

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

/// The aggregator's reply to one question.
pub(super) enum Reply {
    Distinct(v1::DistinctResponse),
    Frequency(v1::FrequencyResponse),
    Topk(v1::TopKResponse),
    Membership(v1::MembershipResponse),
}

/// A reply as JSON (the total with its groups) and as text under `header`; `item` is
/// the one asked about, for frequency.
pub(super) fn present(header: &str, reply: Reply, item: &[u8]) -> (Value, String) {
    match reply {
        Reply::Distinct(r) => {
            let total = distinct_value(r.answer.as_ref(), r.coverage.as_ref());
            let groups = keyed(&r.groups, |g| {
                (
                    &g.key,
                    distinct_value(g.answer.as_ref(), g.coverage.as_ref()),
                )
            });
            answered(header, total, groups, distinct_text)
        }
        Reply::Frequency(r) => {
            let name = String::from_utf8_lossy(item).into_owned();
            let total = frequency_value(&name, r.answer.as_ref(), r.coverage.as_ref());
            let groups = keyed(&r.groups, |g| {
                (
                    &g.key,
                    frequency_value(&name, g.answer.as_ref(), g.coverage.as_ref()),
                )
            });
            answered(header, total, groups, frequency_text)
        }
        Reply::Topk(r) => {
            let total = topk_value(&r.items, r.coverage.as_ref());
            let groups = keyed(&r.groups, |g| {
                (&g.key, topk_value(&g.items, g.coverage.as_ref()))
            });
            answered(header, total, groups, topk_text)
        }
        Reply::Membership(r) => {
            let total = membership_value(r.answer.as_ref(), r.coverage.as_ref());
            let groups = keyed(&r.groups, |g| {
                (
                    &g.key,
                    membership_value(g.answer.as_ref(), g.coverage.as_ref()),
                )
            });
            answered(header, total, groups, membership_text)
        }
    }
}

/// Each group's key and value.
fn keyed<G>(groups: &[G], entry: impl Fn(&G) -> (&String, Value)) -> Vec<(String, Value)> {
    groups
        .iter()
        .map(|g| {
            let (key, value) = entry(g);
            (key.clone(), value)
        })
        .collect()
}

pub(crate) fn coverage_fields(v: &mut Value, c: Option<&v1::Coverage>) {
    let c = c.cloned().unwrap_or_default();
    v["sketches_merged"] = json!(c.sketches_merged);
    v["server_hours_missing"] = json!(c.server_hours_missing);
    v["partitions_missing"] = json!(c.partitions_missing);
    v["missing"] = c
        .missing
        .iter()
        .map(|m| json!({"server": m.server, "hours": m.hours}))
        .collect();
}

pub(crate) fn distinct_value(a: Option<&v1::DistinctAnswer>, c: Option<&v1::Coverage>) -> Value {
    let a = a.cloned().unwrap_or_default();
    let mut v = estimate_value(Some(&a));
    coverage_fields(&mut v, c);
    v
}

fn frequency_value(item: &str, a: Option<&v1::FrequencyAnswer>, c: Option<&v1::Coverage>) -> Value {
    let a = a.cloned().unwrap_or_default();
    let mut v = json!({
        "item": item,
        "estimate": a.estimate,
        "max_overcount": a.max_overcount,
        "total": a.total,
    });
    coverage_fields(&mut v, c);
    v
}

fn topk_value(items: &[v1::TopItem], c: Option<&v1::Coverage>) -> Value {
    let mut v = json!({
        "items": items.iter().map(|t| json!({
            "item": String::from_utf8_lossy(&t.item),
            "estimate": t.estimate,
            "lower": t.lower,
            "upper": t.upper,
        })).collect::<Vec<_>>(),
    });
    coverage_fields(&mut v, c);
    v
}

fn membership_value(a: Option<&v1::MembershipAnswer>, c: Option<&v1::Coverage>) -> Value {
    let a = a.cloned().unwrap_or_default();
    let mut v = json!({
        "maybe_present": a.maybe_present,
        "definitely_absent": a.definitely_absent,
        "filters_consulted": a.filters_consulted,
        "range_fpr": a.range_fpr,
        "all_false_probability": a.all_false_probability,
        "saturated_filters": a.saturated_filters,
        "seen_in": a.seen_in.iter().map(|s| json!({
            "server": s.server,
            "from": hourglass_rpc::time::rfc3339_hour(s.start_hour),
            "start_hour": s.start_hour,
            "hours": s.hours,
            "fpr": s.fpr,
        })).collect::<Vec<_>>(),
        "seen_in_count": a.seen_in_count,
        "fill_ratio": a.fill_ratio,
        "estimated_fpr": a.estimated_fpr,
        "past_design_point": a.past_design_point,
    });
    coverage_fields(&mut v, c);
    v
}

/// An answer's JSON (the total with its groups) and its text under `header`.
fn answered(
    header: &str,
    total: Value,
    groups: Vec<(String, Value)>,
    text: fn(&Value) -> String,
) -> (Value, String) {
    let text = render(header, &total, &groups, text);
    (with_groups(total, groups), text)
}

fn with_groups(mut total: Value, groups: Vec<(String, Value)>) -> Value {
    if !groups.is_empty() {
        total["groups"] = groups
            .into_iter()
            .map(|(key, mut v)| {
                v["key"] = json!(key);
                v
            })
            .collect();
    }
    total
}

/// Fields the text output needs but the documented JSON keys do not include.
const TEXT_ONLY: [&str; 2] = ["missing", "past_design_point"];

pub(super) fn strip_text_only_fields(v: &mut Value) {
    if let Some(object) = v.as_object_mut() {
        for key in TEXT_ONLY {
            object.remove(key);
        }
    }
    if let Some(groups) = v.get_mut("groups").and_then(Value::as_array_mut) {
        groups.iter_mut().for_each(strip_text_only_fields);
    }
}

fn f(v: &Value, key: &str) -> f64 {
    v[key].as_f64().unwrap_or(0.0)
}

pub(super) fn u(v: &Value, key: &str) -> u64 {
    v[key].as_u64().unwrap_or(0)
}

/// `1,204,331 ± 0.81% (95%: 1,184,900 – 1,223,762)`: the form every distinct answer takes.
pub fn distinct_text(v: &Value) -> String {
    let (est, se) = (f(v, "estimate"), f(v, "std_error"));
    if hourglass_rpc::is_unbounded(se) {
        // A saturated sketch: only bounds, and the upper one may be unbounded too.
        return format!(
            "between {} and {} (beyond what the sketches can measure: saturated)",
            count(f(v, "lower95")),
            count(f(v, "upper95"))
        );
    }
    let relative = if est > 0.0 { se / est } else { 0.0 };
    format!(
        "{} ± {} (95%: {} – {})",
        count(est),
        percent(relative),
        count(f(v, "lower95")),
        count(f(v, "upper95"))
    )
}

fn frequency_text(v: &Value) -> String {
    format!(
        "{} (at most {} over, of {} in all)",
        grouped(u(v, "estimate")),
        grouped(u(v, "max_overcount")),
        grouped(u(v, "total"))
    )
}

/// A range lookup: definitely absent, or where it was seen, each with the rates that
/// qualify it.
fn membership_text(v: &Value) -> String {
    let consulted = u(v, "filters_consulted");
    let mut text = if v["maybe_present"] == true {
        let seen = v["seen_in"].as_array().cloned().unwrap_or_default();
        let mut text = format!(
            "seen (maybe) in {} of {} filters; an absent item would be seen somewhere here with probability {}, and in all of these with probability {}",
            grouped(u(v, "seen_in_count")),
            grouped(consulted),
            percent(f(v, "range_fpr")),
            percent(f(v, "all_false_probability")),
        );
        for s in &seen {
            let hours = u(s, "hours");
            text += &format!(
                "\n  {}  {}{}  (filter false-positive rate {})",
                s["server"].as_str().unwrap_or(""),
                s["from"].as_str().unwrap_or(""),
                if hours == 1 {
                    String::new()
                } else {
                    format!(" (a day rollup, {hours} hours)")
                },
                percent(f(s, "fpr")),
            );
        }
        if (seen.len() as u64) < u(v, "seen_in_count") {
            text += &format!(
                "\n  … and {} more",
                grouped(u(v, "seen_in_count") - seen.len() as u64)
            );
        }
        text
    } else if consulted == 0 {
        "no data: no filter covers the selection".to_string()
    } else {
        format!(
            "definitely absent from all {} filters (a \"seen\" would have been wrong with probability {})",
            grouped(consulted),
            percent(f(v, "range_fpr")),
        )
    };
    let saturated = u(v, "saturated_filters");
    if saturated > 0 {
        text += &format!(
            "\nwarning: {} filters are so full that they say \"maybe\" to at least half of all items",
            grouped(saturated)
        );
    }
    if v["past_design_point"] == true {
        text += &format!(
            "\nwarning: some filters are past their design point (fullest {} full): false positives above their target",
            percent(f(v, "fill_ratio"))
        );
    }
    text
}

fn topk_text(v: &Value) -> String {
    let items = v["items"].as_array().cloned().unwrap_or_default();
    if items.is_empty() {
        return "no items".to_string();
    }
    let names: Vec<String> = items
        .iter()
        .map(|i| format!("{:?}", i["item"].as_str().unwrap_or("")))
        .collect();
    let width = item_width(&names);
    let mut text = format!(
        "\n  {:<width$}  {:>14}  {:>14}  {:>14}",
        "item", "estimate", "lower", "upper"
    );
    for (i, name) in items.iter().zip(&names) {
        text += &format!(
            "\n  {name:<width$}  {:>14}  {:>14}  {:>14}",
            grouped(u(i, "estimate")),
            grouped(u(i, "lower")),
            grouped(u(i, "upper"))
        );
    }
    text
}

/// The warning of a cluster answer that lacks partitions no node answered for.
pub(crate) fn partitions_text(v: &Value) -> Option<String> {
    let missing = u(v, "partitions_missing");
    (missing > 0).then(|| {
        format!(
            "{} partitions of the cluster had no node answering for them (all their owners down, cut off or catching up): the answer may be low",
            grouped(missing)
        )
    })
}

pub(crate) fn missing_text(v: &Value) -> Option<String> {
    let missing = u(v, "server_hours_missing");
    if missing == 0 {
        return None;
    }
    let servers: Vec<String> = v["missing"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|m| {
                    format!(
                        "{} ({})",
                        m["server"].as_str().unwrap_or("?"),
                        u(m, "hours")
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    Some(format!(
        "{} server-hours had no data (agent down or unreachable: the answer may be low): {}",
        grouped(missing),
        servers.join(", ")
    ))
}

fn render(
    header: &str,
    total: &Value,
    groups: &[(String, Value)],
    answer: fn(&Value) -> String,
) -> String {
    let mut text = format!("{header}\n");
    if groups.is_empty() {
        text += &format!("{}\n", answer(total));
    } else {
        let width = groups
            .iter()
            .map(|(k, _)| k.chars().count())
            .max()
            .unwrap_or(0)
            .max(5);
        for (key, v) in groups {
            text += &format!("  {key:<width$}  {}\n", answer(v));
        }
        text += &format!("  {:<width$}  {}\n", "total", answer(total));
    }
    text += &format!("merged {} sketches\n", grouped(u(total, "sketches_merged")));
    if let Some(missing) = missing_text(total) {
        text += &format!("warning: {missing}\n");
    }
    if let Some(missing) = partitions_text(total) {
        text += &format!("warning: {missing}\n");
    }
    text
}
