//! Editing one type's retry policy (or the `*` default): a form whose fields inherit when left
//! empty, validation that names the field, a live preview of the schedule as you type (and a
//! Preview button that works without JavaScript), a dry run over the jobs waiting to retry,
//! and the version history with what changed and a restore button.

use leptos::prelude::*;
use leptos_router::hooks::use_query_map;
use serde::{Deserialize, Serialize};

use crate::auth::{CsrfField, ReadOnlyNote, use_can_act};
use crate::charts::{DelayBar, DelayChart};
use crate::error::AppError;
use crate::feedback::{ActionResult, ErrorBox};
use crate::filters::urlencode;
use crate::time_text::When;

/// The policy form: one string per field, empty meaning "inherit".
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyForm {
    #[serde(default)]
    pub max_attempts: String,
    #[serde(default)]
    pub backoff_strategy: String,
    #[serde(default)]
    pub initial_interval: String,
    #[serde(default)]
    pub backoff_coefficient: String,
    #[serde(default)]
    pub max_interval: String,
    /// `true` (OJS ±50 %), `false`, `full`, `proportional`, or empty.
    #[serde(default)]
    pub jitter: String,
    /// The fraction for `proportional` jitter.
    #[serde(default)]
    pub jitter_fraction: String,
    /// Patterns separated by commas or new lines.
    #[serde(default)]
    pub non_retryable_errors: String,
    #[serde(default)]
    pub on_exhaustion: String,
    /// ISO-8601 delays separated by commas or spaces (for `custom`).
    #[serde(default)]
    pub schedule: String,
}

/// The field names in form order, with their labels.
const FIELD_NAMES: [&str; 10] = [
    "max_attempts",
    "backoff_strategy",
    "initial_interval",
    "backoff_coefficient",
    "max_interval",
    "jitter",
    "jitter_fraction",
    "non_retryable_errors",
    "on_exhaustion",
    "schedule",
];

impl PolicyForm {
    pub fn get(&self, field: &str) -> &str {
        match field {
            "max_attempts" => &self.max_attempts,
            "backoff_strategy" => &self.backoff_strategy,
            "initial_interval" => &self.initial_interval,
            "backoff_coefficient" => &self.backoff_coefficient,
            "max_interval" => &self.max_interval,
            "jitter" => &self.jitter,
            "jitter_fraction" => &self.jitter_fraction,
            "non_retryable_errors" => &self.non_retryable_errors,
            "on_exhaustion" => &self.on_exhaustion,
            "schedule" => &self.schedule,
            _ => "",
        }
    }

    pub fn set(&mut self, field: &str, value: String) {
        let slot = match field {
            "max_attempts" => &mut self.max_attempts,
            "backoff_strategy" => &mut self.backoff_strategy,
            "initial_interval" => &mut self.initial_interval,
            "backoff_coefficient" => &mut self.backoff_coefficient,
            "max_interval" => &mut self.max_interval,
            "jitter" => &mut self.jitter,
            "jitter_fraction" => &mut self.jitter_fraction,
            "non_retryable_errors" => &mut self.non_retryable_errors,
            "on_exhaustion" => &mut self.on_exhaustion,
            "schedule" => &mut self.schedule,
            _ => return,
        };
        *slot = value;
    }

    /// As URL query pairs (for the no-JavaScript preview).
    pub fn to_query_string(&self) -> String {
        FIELD_NAMES.iter().map(|f| format!("{f}={}", urlencode(self.get(f)))).collect::<Vec<_>>().join("&")
    }
}

#[cfg(feature = "ssr")]
mod convert {
    use rebound_queue::PolicyPatch;
    use serde_json::{Map, Value, json};

    use super::PolicyForm;
    use crate::error::{AppError, quoted};

    fn invalid(field: &str, reason: impl Into<String>) -> AppError {
        AppError::Invalid { field: field.into(), reason: reason.into() }
    }

    fn list(s: &str) -> Vec<String> {
        s.split(|c: char| c == ',' || c.is_whitespace()).map(str::trim).filter(|p| !p.is_empty()).map(str::to_string).collect()
    }

    impl PolicyForm {
        /// The partial policy the form describes; errors name the field.
        pub fn to_patch(&self) -> Result<PolicyPatch, AppError> {
            let mut m = Map::new();
            let t = |s: &str| s.trim().to_string();
            if !self.max_attempts.trim().is_empty() {
                let n: u64 = t(&self.max_attempts).parse().map_err(|_| invalid("max_attempts", format!("must be a whole number ≥ 1, got {}", quoted(self.max_attempts.trim()))))?;
                m.insert("max_attempts".into(), json!(n));
            }
            for key in ["backoff_strategy", "initial_interval", "max_interval", "on_exhaustion"] {
                let v = t(self.get(key));
                if !v.is_empty() {
                    m.insert(key.into(), json!(v));
                }
            }
            if !self.backoff_coefficient.trim().is_empty() {
                let c: f64 = t(&self.backoff_coefficient).parse().map_err(|_| invalid("backoff_coefficient", format!("must be a number ≥ 1.0, got {}", quoted(self.backoff_coefficient.trim()))))?;
                m.insert("backoff_coefficient".into(), json!(c));
            }
            match self.jitter.trim() {
                "" => {}
                "true" => {
                    m.insert("jitter".into(), json!(true));
                }
                "false" => {
                    m.insert("jitter".into(), json!(false));
                }
                "full" => {
                    m.insert("jitter".into(), json!("full"));
                }
                "proportional" => {
                    let f: f64 = t(&self.jitter_fraction).parse().map_err(|_| invalid("jitter", format!("the proportional fraction must be a number in (0, 1], got {}", quoted(self.jitter_fraction.trim()))))?;
                    m.insert("jitter".into(), json!({ "proportional": f }));
                }
                other => return Err(invalid("jitter", format!("unknown jitter mode {}", quoted(other)))),
            }
            if !self.non_retryable_errors.trim().is_empty() {
                m.insert("non_retryable_errors".into(), json!(list(&self.non_retryable_errors)));
            }
            if !self.schedule.trim().is_empty() {
                m.insert("schedule".into(), json!(list(&self.schedule)));
            }
            Ok(PolicyPatch::from_json(&Value::Object(m))?)
        }

        /// The form showing a saved partial policy.
        pub fn from_patch(p: &PolicyPatch) -> PolicyForm {
            use rebound_queue::policy::{Jitter, iso8601};
            let mut f = PolicyForm {
                max_attempts: p.max_attempts.map(|n| n.to_string()).unwrap_or_default(),
                backoff_strategy: p.backoff_strategy.map(|s| s.to_string()).unwrap_or_default(),
                initial_interval: p.initial_interval.map(iso8601::format).unwrap_or_default(),
                backoff_coefficient: p.backoff_coefficient.map(|c| c.to_string()).unwrap_or_default(),
                max_interval: p.max_interval.map(iso8601::format).unwrap_or_default(),
                non_retryable_errors: p.non_retryable_errors.as_ref().map(|v| v.join(", ")).unwrap_or_default(),
                on_exhaustion: p.on_exhaustion.map(|o| o.to_string()).unwrap_or_default(),
                schedule: p.schedule.as_ref().map(|v| v.iter().map(|d| iso8601::format(*d)).collect::<Vec<_>>().join(", ")).unwrap_or_default(),
                ..Default::default()
            };
            match p.jitter {
                None => {}
                Some(Jitter::Ojs) => f.jitter = "true".into(),
                Some(Jitter::Off) => f.jitter = "false".into(),
                Some(Jitter::Full) => f.jitter = "full".into(),
                Some(Jitter::Proportional(x)) => {
                    f.jitter = "proportional".into();
                    f.jitter_fraction = x.to_string();
                }
            }
            f
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VersionRow {
    pub version: i32,
    pub created: When,
    pub created_by: Option<String>,
    pub note: Option<String>,
    /// The saved JSON, or `None` for a deletion.
    pub policy: Option<String>,
    /// "max_attempts: 3 → 5" lines against the previous version.
    pub changes: Vec<String>,
    pub current: bool,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EditorData {
    pub job_type: String,
    pub saved: PolicyForm,
    pub saved_version: Option<i32>,
    /// What each field inherits when left empty (the layer below), as shown in placeholders.
    pub inherited: Vec<(String, String)>,
    pub history: Vec<VersionRow>,
    /// A saved policy that no longer parses (edited by hand in the database).
    pub saved_error: Option<String>,
}

#[server(endpoint = "load_policy_editor")]
pub async fn load_policy_editor(job_type: String) -> Result<EditorData, AppError> {
    use rebound_queue::PolicyPatch;
    use rebound_queue::store::DEFAULT_POLICY_KEY;

    crate::auth::signed_in()?;
    let store = crate::state::store()?;
    let job_type = job_type.trim().to_string();
    if job_type != DEFAULT_POLICY_KEY {
        rebound_queue::job::validate_type(&job_type).map_err(|e| AppError::Invalid { field: "type".into(), reason: crate::error::requoted(e.reason, &job_type) })?;
    }
    let now = store.now().await?;
    let stored = store.policy(&job_type).await?;
    let (saved, saved_error) = match stored.as_ref().map(|p| PolicyPatch::from_json(&p.policy)) {
        Some(Ok(p)) => (PolicyForm::from_patch(&p), None),
        Some(Err(e)) => (PolicyForm::default(), Some(e.to_string())),
        None => (PolicyForm::default(), None),
    };
    let inherited = inherited_values(&store, &job_type).await?;
    let versions = store.policy_history(&job_type).await?;
    let current = stored.as_ref().map(|p| p.version);
    let mut history = Vec::with_capacity(versions.len());
    for (i, v) in versions.iter().enumerate() {
        let previous = versions.get(i + 1).and_then(|p| p.policy.clone());
        history.push(VersionRow {
            version: v.version,
            created: When::of(v.created_at, now),
            created_by: v.created_by.clone(),
            note: v.note.clone(),
            policy: v.policy.as_ref().map(|p| p.to_string()),
            changes: changes(previous.as_ref(), v.policy.as_ref()),
            current: Some(v.version) == current,
        });
    }
    Ok(EditorData { job_type, saved, saved_version: current, inherited, history, saved_error })
}

/// The values a field falls back to when the form leaves it empty: for a type, the defaults
/// with `*`; for `*`, the built-in defaults.
#[cfg(feature = "ssr")]
async fn inherited_values(store: &rebound_queue::Store, job_type: &str) -> Result<Vec<(String, String)>, AppError> {
    let base = if job_type == rebound_queue::store::DEFAULT_POLICY_KEY {
        rebound_queue::RetryPolicy::default()
    } else {
        store.effective_policy("rebound.default-probe", None).await?.policy
    };
    let wire = base.to_json();
    Ok(wire
        .as_object()
        .map(|o| {
            o.iter()
                .map(|(k, v)| {
                    let text = match v {
                        serde_json::Value::String(s) => s.clone(),
                        serde_json::Value::Array(a) => a.iter().map(|x| x.as_str().map(str::to_string).unwrap_or_else(|| x.to_string())).collect::<Vec<_>>().join(", "),
                        other => other.to_string(),
                    };
                    (k.clone(), text)
                })
                .collect()
        })
        .unwrap_or_default())
}

/// Field-level differences between two saved versions.
#[cfg(feature = "ssr")]
fn changes(before: Option<&serde_json::Value>, after: Option<&serde_json::Value>) -> Vec<String> {
    use serde_json::Value;
    let empty = serde_json::Map::new();
    let obj = |v: Option<&Value>| v.and_then(Value::as_object).cloned().unwrap_or_else(|| empty.clone());
    let (b, a) = (obj(before), obj(after));
    if after.is_none() {
        return vec!["deleted: the type falls back to the defaults".into()];
    }
    let mut keys: Vec<&String> = b.keys().chain(a.keys()).collect();
    keys.sort();
    keys.dedup();
    keys.into_iter()
        .filter_map(|k| match (b.get(k), a.get(k)) {
            (Some(x), Some(y)) if x == y => None,
            (Some(x), Some(y)) => Some(format!("{k}: {x} → {y}")),
            (None, Some(y)) => Some(format!("{k}: inherited → {y}")),
            (Some(x), None) => Some(format!("{k}: {x} → inherited")),
            (None, None) => None,
        })
        .collect()
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PreviewRow {
    pub retry: u32,
    pub attempt: u32,
    pub delay: String,
    pub band: String,
    pub cumulative: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FieldProblem {
    pub field: String,
    pub reason: String,
}

/// What saving would do to the jobs waiting to retry.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DryRun {
    /// Jobs of the type in `retryable` (counted up to the cap).
    pub waiting: usize,
    pub capped: bool,
    /// Their next runs (already fixed), earliest and latest.
    pub next_runs: Option<(When, When)>,
    /// The delay of the retry after their next failure, now and with the edit: (min, max).
    pub following_now: Option<(String, String)>,
    pub following_new: Option<(String, String)>,
    /// How many would be exhausted by their next failure, now and with the edit.
    pub exhaust_now: usize,
    pub exhaust_new: usize,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PolicyPreview {
    pub problem: Option<FieldProblem>,
    pub rows: Vec<PreviewRow>,
    pub bars: Vec<DelayBar>,
    pub total_wait: String,
    pub on_exhaustion: String,
    pub dry_run: Option<DryRun>,
}

/// The most waiting jobs the dry run looks at.
#[cfg(feature = "ssr")]
const DRY_RUN_CAP: i64 = 10_000;

#[server(endpoint = "preview_policy")]
pub async fn preview_policy(job_type: String, policy: PolicyForm) -> Result<PolicyPreview, AppError> {
    use rebound_queue::RetryPolicy;
    use rebound_queue::store::DEFAULT_POLICY_KEY;

    use crate::time_text::duration_text;

    crate::auth::signed_in()?;
    // The type names the jobs the dry run counts: a prefix (`email.*`) would count others'.
    crate::error::check_job_type(&job_type)?;
    let store = crate::state::store()?;
    let ms = |d: std::time::Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    let problem_only = |e: AppError| {
        let (field, reason) = match e {
            AppError::Invalid { field, reason } => (field, reason),
            other => ("policy".to_string(), other.to_string()),
        };
        Ok(PolicyPreview { problem: Some(FieldProblem { field, reason }), rows: vec![], bars: vec![], total_wait: String::new(), on_exhaustion: String::new(), dry_run: None })
    };
    let patch = match policy.to_patch() {
        Ok(p) => p,
        Err(e) => return problem_only(e),
    };
    let is_default = job_type == DEFAULT_POLICY_KEY;
    let base = if is_default { RetryPolicy::default() } else { store.effective_policy("rebound.default-probe", None).await?.policy };
    let candidate = match rebound_queue::policy::resolve(&base, Some(&patch), None) {
        Ok(r) => r.policy,
        Err(e) => return problem_only(e.into()),
    };
    let plan = candidate.planned_retries(0, 100);
    let rows = plan
        .iter()
        .map(|r| PreviewRow {
            retry: r.retry,
            attempt: r.attempt,
            delay: duration_text(ms(r.delay)),
            band: if r.band.0 == r.band.1 {
                "none".to_string()
            } else {
                format!("{} – {}", duration_text(ms(r.band.0)), duration_text(ms(r.band.1)))
            },
            cumulative: duration_text(ms(r.cumulative)),
        })
        .collect();
    let bars = plan
        .iter()
        .map(|r| DelayBar { label: format!("#{}", r.retry), delay_ms: ms(r.delay), band_min_ms: ms(r.band.0), band_max_ms: ms(r.band.1), past: false })
        .collect();

    let dry_run = if is_default {
        None
    } else {
        let current = store.effective_policy(&job_type, None).await?.policy;
        let waiting = store.waiting_retries(&job_type, DRY_RUN_CAP).await?;
        let now = store.now().await?;
        let runs: Vec<_> = waiting.iter().filter_map(|(_, _, at)| *at).collect();
        let next_runs = runs.iter().min().zip(runs.iter().max()).map(|(a, b)| (When::of(*a, now), When::of(*b, now)));
        // A job at attempt k runs attempt k + 1 next; if that fails, retry k + 1 follows,
        // unless k + 1 reaches max_attempts.
        let following = |p: &RetryPolicy| {
            let delays: Vec<u64> = waiting
                .iter()
                .map(|(_, k, _)| (*k).max(0) as u32 + 1)
                .filter(|n| *n < p.effective_max_attempts())
                .map(|n| ms(p.delay_for(n)))
                .collect();
            let exhausted = waiting.len() - delays.len();
            let range = delays.iter().min().zip(delays.iter().max()).map(|(a, b)| (duration_text(*a), duration_text(*b)));
            (range, exhausted)
        };
        let (following_now, exhaust_now) = following(&current);
        let (following_new, exhaust_new) = following(&candidate);
        Some(DryRun {
            waiting: waiting.len(),
            capped: waiting.len() as i64 >= DRY_RUN_CAP,
            next_runs,
            following_now,
            following_new,
            exhaust_now,
            exhaust_new,
        })
    };
    Ok(PolicyPreview {
        problem: None,
        rows,
        bars,
        total_wait: duration_text(ms(candidate.total_delay())),
        on_exhaustion: candidate.on_exhaustion.to_string(),
        dry_run,
    })
}

/// Saves the form as the type's new policy version, or (intent `preview`, the no-JavaScript
/// Preview button) sends the browser back to the editor showing the preview of these values.
#[server(endpoint = "save_policy")]
pub async fn save_policy(csrf: String, job_type: String, policy: PolicyForm, #[server(default)] intent: String, #[server(default)] note: String) -> Result<String, AppError> {
    if intent == "preview" {
        crate::auth::signed_in()?;
        leptos_axum::redirect(&format!("/policies/edit?type={}&preview=1&{}", urlencode(&job_type), policy.to_query_string()));
        return Ok("Preview below.".into());
    }
    let actor = crate::auth::authorize_mutation(&csrf)?;
    let saved = async {
        crate::error::check_job_type(job_type.trim())?;
        let store = crate::state::store()?;
        let patch = policy.to_patch()?;
        let note = Some(note.trim()).filter(|n| !n.is_empty());
        Ok::<_, AppError>(store.put_policy(job_type.trim(), &patch, &actor, note).await?)
    }
    .await
    // Without JavaScript, refused values come back to the editor, shown as Preview shows them.
    .map_err(|e| {
        let back = format!("/policies/edit?type={}&preview=1&{}", urlencode(&job_type), policy.to_query_string());
        crate::feedback::back_with_typed_values::<SavePolicy>(&back, e)
    })?;
    Ok(format!("Saved version {} of the {} policy. It applies at each job's next failure.", saved.version, saved.job_type))
}

#[server(endpoint = "restore_policy")]
pub async fn restore_policy(csrf: String, job_type: String, version: i32) -> Result<String, AppError> {
    let actor = crate::auth::authorize_mutation(&csrf)?;
    crate::error::check_job_type(&job_type)?;
    if version < 1 {
        return Err(AppError::Invalid { field: "version".into(), reason: format!("{version} is not a version number (they start at 1)") });
    }
    let store = crate::state::store()?;
    let saved = store.restore_policy(&job_type, version, &actor).await?;
    Ok(format!("Restored version {version} as version {}.", saved.version))
}

#[server(endpoint = "reset_policy")]
pub async fn reset_policy(csrf: String, job_type: String) -> Result<String, AppError> {
    let actor = crate::auth::authorize_mutation(&csrf)?;
    crate::error::check_job_type(&job_type)?;
    let store = crate::state::store()?;
    Ok(if store.delete_policy(&job_type, &actor).await? {
        format!("The {job_type} policy is removed: its jobs use the defaults from their next failure on.")
    } else {
        format!("{job_type} had no saved policy.")
    })
}

#[component]
pub fn PolicyEditorPage() -> impl IntoView {
    let q = use_query_map();
    let job_type = Memo::new(move |_| q.with(|q| q.get("type").unwrap_or_else(|| "*".into())));
    // Values from a no-JavaScript Preview come back in the URL.
    let from_url = Memo::new(move |_| {
        q.with(|q| {
            q.get("preview").map(|_| {
                let mut f = PolicyForm::default();
                for name in FIELD_NAMES {
                    f.set(name, q.get(name).unwrap_or_default());
                }
                f
            })
        })
    });
    let save = ServerAction::<SavePolicy>::new();
    let restore = ServerAction::<RestorePolicy>::new();
    let reset = ServerAction::<ResetPolicy>::new();
    let data = Resource::new(
        move || (job_type.get(), save.version().get(), restore.version().get(), reset.version().get()),
        |(t, ..)| load_policy_editor(t),
    );
    view! {
        <p class="crumbs"><a href="/policies">"Retry policies"</a> " / edit"</p>
        <ActionResult action=save/>
        <ActionResult action=restore/>
        <ActionResult action=reset/>
        <Transition fallback=|| view! { <p class="muted">"Loading…"</p> }>
            {move || Suspend::new(async move {
                match data.await {
                    Ok(d) => {
                        let initial = from_url.get_untracked().unwrap_or_else(|| d.saved.clone());
                        view! { <PolicyEditor data=d initial=initial save=save restore=restore reset=reset/> }.into_any()
                    }
                    Err(e) => view! { <ErrorBox error=e/> }.into_any(),
                }
            })}
        </Transition>
    }
}

#[component]
fn PolicyEditor(
    data: EditorData,
    initial: PolicyForm,
    save: ServerAction<SavePolicy>,
    restore: ServerAction<RestorePolicy>,
    reset: ServerAction<ResetPolicy>,
) -> impl IntoView {
    let can_act = use_can_act();
    let form = RwSignal::new(initial.clone());
    let job_type = data.job_type.clone();
    let preview = {
        let job_type = job_type.clone();
        Resource::new(move || form.get(), move |f| preview_policy(job_type.clone(), f))
    };
    let inherited = data.inherited.clone();
    let placeholder = move |field: &str| {
        let key = if field == "jitter_fraction" { "jitter" } else { field };
        inherited
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| if v.is_empty() { "inherit: none".to_string() } else { format!("inherit: {v}") })
            .unwrap_or_else(|| "inherit".into())
    };
    // The field a failed save or the preview named, to mark it.
    let problem_field = Memo::new(move |_| {
        save.value().get().and_then(|r| r.err()).and_then(|e| e.field().map(str::to_string))
    });
    let title = if job_type == "*" { "Default policy (*)".to_string() } else { format!("Policy for {job_type}") };
    let bind = move |field: &'static str| move |ev: leptos::ev::Event| form.update(|f| f.set(field, event_target_value(&ev)));
    let text_field = {
        let placeholder = placeholder.clone();
        let initial = initial.clone();
        move |field: &'static str, label: &'static str, hint: &'static str| {
            view! {
                <label class="field" class:invalid=move || problem_field.get().as_deref() == Some(field)>
                    <span class="field-label">{label}</span>
                    <input name=format!("policy[{field}]") value=initial.get(field).to_string() placeholder=placeholder(field) on:input=bind(field)/>
                    <small class="hint">{hint}</small>
                </label>
            }
        }
    };
    let select_field = {
        let placeholder = placeholder.clone();
        let initial = initial.clone();
        move |field: &'static str, label: &'static str, choices: &'static [(&'static str, &'static str)]| {
            let current = initial.get(field).to_string();
            view! {
                <label class="field" class:invalid=move || problem_field.get().as_deref() == Some(field)>
                    <span class="field-label">{label}</span>
                    <select name=format!("policy[{field}]") on:change=bind(field)>
                        <option value="" selected=current.is_empty()>{placeholder(field)}</option>
                        {choices.iter().map(|(v, l)| view! { <option value=*v selected=current == *v>{*l}</option> }).collect_view()}
                    </select>
                </label>
            }
        }
    };
    let history = data.history.clone();
    let reset_type = job_type.clone();
    let history_type = job_type.clone();
    let has_saved = data.saved_version.is_some();
    view! {
        <h1>{title}</h1>
        {data.saved_error.map(|e| view! { <div class="alert error">"The saved policy no longer parses: " {e}</div> })}
        <ReadOnlyNote/>
        <div class="editor-layout">
            <section class="panel editor">
                <h2>"Fields " <small class="muted">"(empty = inherit)"</small></h2>
                <ActionForm action=save>
                    <CsrfField/>
                    <input type="hidden" name="job_type" value=job_type.clone()/>
                    <div class="field-grid">
                        {text_field("max_attempts", "Max attempts", "total executions; 1 = no retry")}
                        {select_field("backoff_strategy", "Backoff strategy", &[("constant", "constant"), ("linear", "linear"), ("exponential", "exponential"), ("polynomial", "polynomial"), ("custom", "custom (schedule)")])}
                        {text_field("initial_interval", "Initial interval", "ISO-8601, e.g. PT1S, PT30S, PT5M")}
                        {text_field("backoff_coefficient", "Backoff coefficient", "≥ 1.0; growth factor or exponent")}
                        {text_field("max_interval", "Max interval", "cap on every delay, e.g. PT1H")}
                        {select_field("jitter", "Jitter", &[("true", "±50 % (OJS)"), ("false", "off"), ("full", "full (0 – delay)"), ("proportional", "proportional ± fraction")])}
                        {text_field("jitter_fraction", "Jitter fraction", "for proportional: 0 < f ≤ 1")}
                        {select_field("on_exhaustion", "On exhaustion", &[("discard", "discard"), ("dead_letter", "dead letter")])}
                        {text_field("non_retryable_errors", "Non-retryable errors", "comma-separated: auth.denied, validation.*")}
                        {text_field("schedule", "Custom schedule", "for custom: PT1S, PT10S, PT1M")}
                    </div>
                    <label class="field wide">
                        <span class="field-label">"Note"</span>
                        <input name="note" placeholder="why, for the history and the audit log"/>
                    </label>
                    <div class="buttons">
                        <button type="submit" name="intent" value="preview">"Preview"</button>
                        <button type="submit" name="intent" value="save" class="primary" disabled=move || !can_act.get()>"Save"</button>
                    </div>
                </ActionForm>
                {has_saved
                    .then(|| {
                        view! {
                            <ActionForm action=reset>
                                <CsrfField/>
                                <input type="hidden" name="job_type" value=reset_type/>
                                <button type="submit" class="link danger" disabled=move || !can_act.get()>"Remove this policy (use the defaults)"</button>
                            </ActionForm>
                        }
                    })}
            </section>
            <section class="panel preview">
                <h2>"Preview"</h2>
                <Transition fallback=|| view! { <p class="muted">"Computing…"</p> }>
                    {move || Suspend::new(async move {
                        match preview.await {
                            Ok(p) => view! { <PreviewBody p=p/> }.into_any(),
                            Err(e) => view! { <ErrorBox error=e/> }.into_any(),
                        }
                    })}
                </Transition>
            </section>
        </div>
        <section class="panel">
            <h2>"History"</h2>
            <History job_type=history_type rows=history restore=restore/>
        </section>
    }
}

#[component]
fn PreviewBody(p: PolicyPreview) -> impl IntoView {
    if let Some(problem) = p.problem {
        return view! {
            <div class="alert error" role="alert" data-field=problem.field.clone()>
                <strong>{problem.field.clone()}</strong> ": " {problem.reason}
            </div>
        }
        .into_any();
    }
    view! {
        <DelayChart bars=p.bars/>
        <p>"Total wait until exhaustion: " <strong class="total-wait">{p.total_wait}</strong> "; then the job " {if p.on_exhaustion == "dead_letter" { "moves to the dead letters" } else { "is discarded" }} "."</p>
        {if p.rows.is_empty() {
            view! { <p class="muted">"No retries: a failure ends the job."</p> }.into_any()
        } else {
            view! {
                <table class="preview-table">
                    <thead><tr><th class="num">"Retry"</th><th class="num">"→ attempt"</th><th>"Delay"</th><th>"Jitter band"</th><th>"Cumulative"</th></tr></thead>
                    <tbody>
                        {p.rows
                            .into_iter()
                            .map(|r| view! { <tr><td class="num">{r.retry}</td><td class="num">{r.attempt}</td><td>{r.delay}</td><td>{r.band}</td><td>{r.cumulative}</td></tr> })
                            .collect_view()}
                    </tbody>
                </table>
            }
            .into_any()
        }}
        {p.dry_run.map(|d| view! { <DryRunNote d=d/> })}
    }
    .into_any()
}

#[component]
fn DryRunNote(d: DryRun) -> impl IntoView {
    if d.waiting == 0 {
        return view! { <p class="dry-run">"Dry run: no job of this type is waiting to retry, so saving changes only future failures."</p> }.into_any();
    }
    let count = if d.capped { format!("{}+", d.waiting) } else { d.waiting.to_string() };
    let runs = d
        .next_runs
        .map(|(a, b)| if a.at == b.at { format!("at {} ({})", a.at, a.relative) } else { format!("between {} and {}", a.at, b.at) })
        .unwrap_or_default();
    let range = |r: Option<(String, String)>| r.map(|(a, b)| if a == b { a } else { format!("{a} – {b}") }).unwrap_or_else(|| "none".into());
    view! {
        <div class="dry-run">
            <p>
                <strong>"Dry run: " {count} " jobs of this type are waiting to retry"</strong>
                " (next runs " {runs} ", already scheduled and unchanged)."
            </p>
            <p>
                "If they fail again, the retry after that waits " <strong>{range(d.following_now)}</strong> " now, "
                <strong>{range(d.following_new)}</strong> " with this edit."
            </p>
            {(d.exhaust_now != d.exhaust_new)
                .then(|| view! { <p>{d.exhaust_new} " would be exhausted at their next failure (now " {d.exhaust_now} ")."</p> })}
        </div>
    }
    .into_any()
}

#[component]
fn History(job_type: String, rows: Vec<VersionRow>, restore: ServerAction<RestorePolicy>) -> impl IntoView {
    let can_act = use_can_act();
    if rows.is_empty() {
        return view! { <p class="muted">"Never saved: this type runs on the defaults."</p> }.into_any();
    }
    view! {
        <table class="history">
            <thead><tr><th class="num">"Version"</th><th>"When"</th><th>"Who"</th><th>"Changes"</th><th>"Note"</th><th></th></tr></thead>
            <tbody>
                {rows
                    .into_iter()
                    .map(|v| {
                        let job_type = job_type.clone();
                        view! {
                            <tr class:current=v.current>
                                <td class="num">"v" {v.version} {v.current.then(|| view! { " " <span class="tag">"current"</span> })}</td>
                                <td title=v.created.relative.clone()>{v.created.at.clone()}</td>
                                <td>{v.created_by.clone().unwrap_or_default()}</td>
                                <td>
                                    <ul class="changes">{v.changes.iter().map(|c| view! { <li><code>{c.clone()}</code></li> }).collect_view()}</ul>
                                    {v.policy.clone().map(|p| view! { <details><summary>"saved JSON"</summary><pre class="json">{p}</pre></details> })}
                                </td>
                                <td>{v.note.clone().unwrap_or_default()}</td>
                                <td>
                                    {(!v.current && v.policy.is_some())
                                        .then(|| {
                                            view! {
                                                <ActionForm action=restore>
                                                    <CsrfField/>
                                                    <input type="hidden" name="job_type" value=job_type/>
                                                    <input type="hidden" name="version" value=v.version/>
                                                    <button type="submit" disabled=move || !can_act.get()>"Restore"</button>
                                                </ActionForm>
                                            }
                                        })}
                                </td>
                            </tr>
                        }
                    })
                    .collect_view()}
            </tbody>
        </table>
    }
    .into_any()
}
