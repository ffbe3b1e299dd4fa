//! What `hourglass query` is asked: the question, its flags, the checks that refuse
//! flags of another question before anything is asked, and the selections as a person
//! reads them.

use anyhow::bail;
use clap::{Args, ValueEnum};
use hourglass_rpc::proto::v1;
use hourglass_rpc::selection::{Selection, Spelling, VsSelection};
use hourglass_rpc::series::validate_metric;

use crate::cli::grpc::{DEFAULT_AGGREGATOR, TlsArgs};

/// Which question to ask.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Question {
    /// How many distinct items? (distinct sketches)
    Distinct,
    /// How often did --item occur? (frequency sketches)
    Frequency,
    /// The --k heaviest items, with bounds. (frequency sketches)
    Topk,
    /// Was --item seen? (membership sketches)
    Membership,
    /// How the selection (A) and the one the --vs-* flags make of it (B) overlap: A ∪ B,
    /// A ∩ B, A only, B only, Jaccard. (distinct sketches)
    Overlap,
    /// Of the items seen in each --period of the range, the share seen again in each later
    /// one. (distinct sketches)
    Retention,
}

#[derive(Debug, Args)]
pub(crate) struct QueryArgs {
    /// The question.
    pub(crate) question: Question,
    #[command(flatten)]
    pub(super) tls: TlsArgs,
    /// The aggregator's gRPC address: `host:port` (http://, or https:// when --tls-ca or
    /// --tls-client-cert is given), or a URL `http://host:port` / `https://host:port`.
    #[arg(long, env = "HOURGLASS_AGGREGATOR", default_value = DEFAULT_AGGREGATOR)]
    pub(crate) aggregator: String,
    #[command(flatten)]
    pub(crate) selection: Selection,
    /// frequency, membership: the item to ask about. membership takes it up to 1,000
    /// times: the items are looked up in one request, each answered as alone.
    #[arg(long)]
    pub(super) item: Vec<String>,
    /// topk: how many items.
    #[arg(long = "k", default_value_t = 10)]
    pub(super) k: u32,
    #[command(flatten)]
    pub(crate) vs: hourglass_rpc::selection::VsSelection,
    /// retention: the length of a period: day, week, or a number of hours (`12h`).
    #[arg(long, value_name = "day|week|Nh")]
    pub(crate) period: Option<String>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub(crate) json: bool,
}

pub(crate) fn question_name(q: Question) -> &'static str {
    match q {
        Question::Distinct => "distinct",
        Question::Frequency => "frequency",
        Question::Topk => "topk",
        Question::Membership => "membership",
        Question::Overlap => "overlap",
        Question::Retention => "retention",
    }
}

/// Selection A's wire selector.
pub(super) fn selector(
    args: &QueryArgs,
    now: chrono::DateTime<chrono::Utc>,
) -> anyhow::Result<v1::Selector> {
    // Checked here too, so that a misspelt metric is refused before connecting.
    validate_metric(&args.selection.metric)?;
    Ok(args.selection.selector(now, Spelling::Flags)?)
}

/// Refuses flags that do not belong to `question`, before anything is asked. Returns the
/// hours of retention's `--period` (0 for the other questions).
pub(crate) fn check_flags(
    question: Question,
    vs: &VsSelection,
    period: Option<&str>,
    grouped_by: bool,
) -> anyhow::Result<u32> {
    let name = question_name(question);
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

/// The question as a person reads it, about `item` when it has one.
pub(crate) fn describe_selection(args: &QueryArgs, item: Option<&str>) -> String {
    let mut text = format!(
        "{} of {}",
        question_name(args.question),
        describe(&args.selection)
    );
    if let Some(item) = item {
        text += &format!(", item {item:?}");
    }
    text
}

/// One selection as a person reads it: `visitors, tags device=mobile, from -7d to now`.
pub(crate) fn describe(selection: &Selection) -> String {
    let mut parts = vec![selection.metric.clone()];
    if !selection.tags.is_empty() {
        parts.push(format!("tags {}", selection.tags.join(",")));
    }
    parts.push(format!("from {} to {}", selection.from, selection.to));
    if !selection.servers.is_empty() {
        parts.push(format!("servers {}", selection.servers.join(",")));
    }
    if !selection.labels.is_empty() {
        parts.push(format!("labels {}", selection.labels.join(",")));
    }
    parts.join(", ")
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
