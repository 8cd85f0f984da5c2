//! Small SVG charts drawn from data the page already has: the planned backoff schedule and the
//! throughput of the last hour/day. Server-rendered, so they show without JavaScript.

use leptos::prelude::*;
use serde::{Deserialize, Serialize};

use crate::time_text::duration_text;

/// One retry's delay with its jitter band, in milliseconds.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DelayBar {
    pub label: String,
    pub delay_ms: u64,
    pub band_min_ms: u64,
    pub band_max_ms: u64,
    /// A delay that already happened (drawn solid) rather than a planned one.
    pub past: bool,
}

const W: f64 = 640.0;
const H: f64 = 200.0;
const LEFT: f64 = 56.0;
const BOTTOM: f64 = 24.0;
const TOP: f64 = 10.0;

/// Bars of delays per retry, with the jitter band as a whisker; the y axis is a square-root
/// scale so a 1 s first retry stays visible next to a 5 min cap.
#[component]
pub fn DelayChart(bars: Vec<DelayBar>) -> impl IntoView {
    if bars.is_empty() {
        return view! { <p class="muted">"No retries to chart."</p> }.into_any();
    }
    let max = bars.iter().map(|b| b.band_max_ms.max(b.delay_ms)).max().unwrap_or(1).max(1) as f64;
    let scale = move |ms: u64| (ms as f64 / max).sqrt() * (H - BOTTOM - TOP);
    let slot = (W - LEFT) / bars.len() as f64;
    let bar_w = (slot * 0.6).min(40.0);
    let ticks: Vec<u64> = [0.0, 0.25, 0.5, 1.0].iter().map(|f: &f64| (max * f) as u64).collect();
    let every = (bars.len() / 20).max(1);
    view! {
        <svg class="chart delay-chart" viewBox=format!("0 0 {W} {H}") role="img" aria-label="Delay before each retry">
            {ticks
                .into_iter()
                .map(|t| {
                    let y = H - BOTTOM - scale(t);
                    view! {
                        <line class="grid" x1=LEFT x2=W y1=y y2=y></line>
                        <text class="axis" x=LEFT - 4.0 y=y + 4.0 text-anchor="end">{duration_text(t)}</text>
                    }
                })
                .collect_view()}
            {bars
                .into_iter()
                .enumerate()
                .map(|(i, b)| {
                    let cx = LEFT + slot * (i as f64 + 0.5);
                    let h = scale(b.delay_ms);
                    let y_lo = H - BOTTOM - scale(b.band_min_ms);
                    let y_hi = H - BOTTOM - scale(b.band_max_ms);
                    let class = if b.past { "bar past" } else { "bar planned" };
                    let title = format!(
                        "{}: {} (jitter {} – {})",
                        b.label,
                        duration_text(b.delay_ms),
                        duration_text(b.band_min_ms),
                        duration_text(b.band_max_ms)
                    );
                    let show_label = i % every == 0;
                    view! {
                        <g>
                            <title>{title}</title>
                            <rect class=class x=cx - bar_w / 2.0 y=H - BOTTOM - h width=bar_w height=h.max(1.0)></rect>
                            {(b.band_max_ms != b.band_min_ms)
                                .then(|| {
                                    view! {
                                        <line class="band" x1=cx x2=cx y1=y_lo y2=y_hi></line>
                                        <line class="band" x1=cx - bar_w / 4.0 x2=cx + bar_w / 4.0 y1=y_hi y2=y_hi></line>
                                        <line class="band" x1=cx - bar_w / 4.0 x2=cx + bar_w / 4.0 y1=y_lo y2=y_lo></line>
                                    }
                                })}
                            {show_label.then(|| view! { <text class="axis" x=cx y=H - 6.0 text-anchor="middle">{b.label.clone()}</text> })}
                        </g>
                    }
                })
                .collect_view()}
        </svg>
    }
    .into_any()
}

/// Completed and failed executions in one time bucket.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ThroughputBucket {
    /// `14:05`
    pub label: String,
    pub completed: i64,
    pub failed: i64,
}

/// Stacked bars of completions (below) and failures (above) per bucket, with the failure rate
/// of the whole window in the caption.
#[component]
pub fn ThroughputChart(buckets: Vec<ThroughputBucket>, caption: &'static str) -> impl IntoView {
    let completed: i64 = buckets.iter().map(|b| b.completed).sum();
    let failed: i64 = buckets.iter().map(|b| b.failed).sum();
    let rate = if completed + failed > 0 { failed as f64 * 100.0 / (completed + failed) as f64 } else { 0.0 };
    let max = buckets.iter().map(|b| b.completed + b.failed).max().unwrap_or(0).max(1) as f64;
    let n = buckets.len().max(1);
    let slot = (W - LEFT) / n as f64;
    let bar_w = (slot * 0.8).max(1.0);
    let plot_h = H - BOTTOM - TOP;
    let label_every = (n / 6).max(1);
    view! {
        <figure class="chart-figure">
            <svg class="chart throughput-chart" viewBox=format!("0 0 {W} {H}") role="img" aria-label=caption>
                {[0.0, 0.5, 1.0]
                    .into_iter()
                    .map(|f: f64| {
                        let y = H - BOTTOM - plot_h * f;
                        view! {
                            <line class="grid" x1=LEFT x2=W y1=y y2=y></line>
                            <text class="axis" x=LEFT - 4.0 y=y + 4.0 text-anchor="end">{format!("{}", (max * f).round() as i64)}</text>
                        }
                    })
                    .collect_view()}
                {buckets
                    .into_iter()
                    .enumerate()
                    .map(|(i, b)| {
                        let x = LEFT + slot * i as f64 + (slot - bar_w) / 2.0;
                        let hc = plot_h * b.completed as f64 / max;
                        let hf = plot_h * b.failed as f64 / max;
                        let title = format!("{}: {} completed, {} failed", b.label, b.completed, b.failed);
                        let label = (i % label_every == 0).then(|| b.label.clone());
                        view! {
                            <g>
                                <title>{title}</title>
                                <rect class="ok" x=x y=H - BOTTOM - hc width=bar_w height=hc></rect>
                                <rect class="failed" x=x y=H - BOTTOM - hc - hf width=bar_w height=hf></rect>
                                {label.map(|l| view! { <text class="axis" x=x y=H - 6.0>{l}</text> })}
                            </g>
                        }
                    })
                    .collect_view()}
            </svg>
            <figcaption>
                {caption} ": " <span class="ok-text">{completed} " completed"</span> ", "
                <span class="failed-text">{failed} " failed"</span> {format!(" ({rate:.1}% failure rate)")}
            </figcaption>
        </figure>
    }
}
