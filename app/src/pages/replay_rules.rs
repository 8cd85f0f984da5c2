//! Dead-letter replay rules (ojs-dead-letter §7): what each rule matches, when and how often it
//! replays, what it has done; operators create, edit, enable, disable and delete them.

// `save_replay_rule` takes one argument per form field: a form that works without JavaScript
// posts them flat, and the client stub the server macro generates has them all too.
#![allow(clippy::too_many_arguments)]

use leptos::prelude::*;
use leptos_router::hooks::use_query_map;
use serde::{Deserialize, Serialize};

use crate::auth::{CsrfField, ReadOnlyNote, use_can_act};
use crate::error::AppError;
use crate::feedback::{ActionResult, ErrorBox};
use crate::filters::urlencode;
use crate::refresh::use_refresh;
use crate::time_text::When;

const PAGE: &str = "/dead-letters/replay-rules";

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ReplayRuleRow {
    pub name: String,
    pub queue: Option<String>,
    pub job_type: Option<String>,
    pub error_type: Option<String>,
    /// ISO-8601, as saved.
    pub delay: String,
    /// As people read it, with the one-minute floor when the saved delay is shorter.
    pub delay_text: String,
    pub max_replays: i32,
    pub enabled: bool,
    pub replayed_total: i64,
    pub last_replayed: Option<When>,
}

/// The rule form's values: a new rule's defaults, or the rule `?edit=` names.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RuleForm {
    pub name: String,
    pub queue: String,
    pub job_type: String,
    pub error_type: String,
    pub delay: String,
    pub max_replays: String,
    pub enabled: bool,
    pub editing: bool,
    /// `?edit=` named a rule that does not exist.
    pub missing: bool,
    /// The most replays a rule may give one job.
    pub replays_limit: i32,
}

/// What was typed into the rule form, carried in the page's URL when a save without
/// JavaScript was refused (`?typed=1&…`), and put back over the form's values.
#[derive(Clone, Debug, PartialEq)]
struct TypedRule {
    name: String,
    queue: String,
    job_type: String,
    error_type: String,
    delay: String,
    max_replays: String,
    enabled: bool,
}

impl TypedRule {
    fn from_query(q: &leptos_router::params::ParamsMap) -> Option<TypedRule> {
        let text = |k: &str| q.get(k).unwrap_or_default();
        (q.get("typed").as_deref() == Some("1")).then(|| TypedRule {
            name: text("name"),
            queue: text("queue"),
            job_type: text("job_type"),
            error_type: text("error_type"),
            delay: text("delay"),
            max_replays: text("max_replays"),
            enabled: q.get("enabled").as_deref() == Some("true"),
        })
    }

    /// The page, editing the rule of the typed name (if there is one), with these values.
    #[cfg(feature = "ssr")]
    fn back_url(&self) -> String {
        let enabled = if self.enabled { "true" } else { "false" };
        let fields = crate::filters::query_pairs([
            ("edit", self.name.trim()),
            ("typed", "1"),
            ("enabled", enabled),
            ("name", &self.name),
            ("queue", &self.queue),
            ("job_type", &self.job_type),
            ("error_type", &self.error_type),
            ("delay", &self.delay),
            ("max_replays", &self.max_replays),
        ]);
        format!("{PAGE}?{fields}")
    }

    /// `form` (the rule being edited, or a new one) showing what was typed.
    fn over(self, form: RuleForm) -> RuleForm {
        RuleForm {
            name: self.name,
            queue: self.queue,
            job_type: self.job_type,
            error_type: self.error_type,
            delay: self.delay,
            max_replays: self.max_replays,
            enabled: self.enabled,
            // The typed name was being saved, not followed from a link.
            missing: false,
            ..form
        }
    }
}

#[server(endpoint = "replay_rules")]
pub async fn replay_rules() -> Result<Vec<ReplayRuleRow>, AppError> {
    use rebound_queue::policy::iso8601;
    use rebound_queue::store::REPLAY_MARGIN;

    use crate::time_text::duration_text;

    crate::auth::signed_in()?;
    let store = crate::state::store()?;
    let now = store.now().await?;
    let ms = |d: std::time::Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    Ok(store
        .replay_rules()
        .await?
        .into_iter()
        .map(|r| {
            let s = r.spec;
            let delay_text = if s.delay < REPLAY_MARGIN {
                format!("{} in effect", duration_text(ms(REPLAY_MARGIN)))
            } else {
                duration_text(ms(s.delay))
            };
            ReplayRuleRow {
                delay: iso8601::format(s.delay),
                delay_text,
                name: s.name,
                queue: s.queue,
                job_type: s.job_type,
                error_type: s.error_type,
                max_replays: s.max_replays,
                enabled: s.enabled,
                replayed_total: r.replayed_total,
                last_replayed: r.last_replayed_at.map(|t| When::of(t, now)),
            }
        })
        .collect())
}

/// `edit` empty: a new rule's defaults; else that rule's values. A rule that is not there (a
/// stale link, or the one just deleted from its own edit page) gives a new rule's form.
#[server(endpoint = "replay_rule_form")]
pub async fn replay_rule_form(#[server(default)] edit: String) -> Result<RuleForm, AppError> {
    use rebound_queue::policy::iso8601;
    use rebound_queue::store::{MAX_REPLAYS, check_rule_name};

    crate::auth::signed_in()?;
    let blank = |name: String, missing: bool| RuleForm {
        name,
        queue: String::new(),
        job_type: String::new(),
        error_type: String::new(),
        delay: "PT1H".into(),
        max_replays: "3".into(),
        enabled: true,
        editing: false,
        missing,
        replays_limit: MAX_REPLAYS,
    };
    if edit.is_empty() {
        return Ok(blank(String::new(), false));
    }
    // A name no rule can have is not looked up, nor put back into the form.
    if check_rule_name(&edit).is_err() {
        return Ok(blank(String::new(), true));
    }
    let store = crate::state::store()?;
    let Some(r) = store.replay_rule(&edit).await? else { return Ok(blank(edit, true)) };
    Ok(RuleForm {
        delay: iso8601::format(r.spec.delay),
        max_replays: r.spec.max_replays.to_string(),
        name: r.spec.name,
        queue: r.spec.queue.unwrap_or_default(),
        job_type: r.spec.job_type.unwrap_or_default(),
        error_type: r.spec.error_type.unwrap_or_default(),
        enabled: r.spec.enabled,
        editing: true,
        missing: false,
        replays_limit: MAX_REPLAYS,
    })
}

/// Creates the rule, or replaces the one of that name. Empty filters match any dead letter.
#[server(endpoint = "save_replay_rule")]
pub async fn save_replay_rule(
    csrf: String,
    #[server(default)] name: String,
    #[server(default)] queue: String,
    #[server(default)] job_type: String,
    #[server(default)] error_type: String,
    #[server(default)] delay: String,
    #[server(default)] max_replays: String,
    // Absent means disabled, as an unticked checkbox would: a rule re-drives jobs, so only an
    // explicit "true" turns one on.
    #[server(default)] enabled: Option<String>,
) -> Result<String, AppError> {
    use rebound_queue::policy::iso8601;
    use rebound_queue::store::ReplayRuleSpec;

    use crate::error::{quoted, requoted};

    let actor = crate::auth::authorize_mutation(&csrf)?;
    // Without JavaScript, refused values come back to the form (see `TypedRule`).
    let typed = TypedRule { name: name.clone(), queue: queue.clone(), job_type: job_type.clone(), error_type: error_type.clone(),
        delay: delay.clone(), max_replays: max_replays.clone(), enabled: enabled.as_deref().map(str::trim) == Some("true") };
    let back = |e: AppError| crate::feedback::back_with_typed_values::<SaveReplayRule>(&typed.back_url(), e);
    let invalid = |field: &str, reason: String| back(AppError::Invalid { field: field.into(), reason });
    let optional = |s: &str| Some(s.trim().to_string()).filter(|s| !s.is_empty());
    let delay_raw = delay.trim();
    let delay = iso8601::parse(delay_raw).map_err(|r| invalid("delay", requoted(r, delay_raw)))?;
    let max_raw = max_replays.trim();
    let max_replays = max_raw.parse::<i32>().map_err(|_| invalid("max_replays", format!("must be a whole number, got {}", quoted(max_raw))))?;
    let enabled = match enabled.as_deref().map(str::trim) {
        Some("true") => true,
        None | Some("false") => false,
        Some(other) => return Err(invalid("enabled", format!("{} is not \"true\" or \"false\"", quoted(other)))),
    };
    let spec = ReplayRuleSpec {
        name: name.trim().to_string(),
        queue: optional(&queue),
        job_type: optional(&job_type),
        error_type: optional(&error_type),
        delay,
        max_replays,
        enabled,
    };
    // The store's reasons quote a refused queue or type whole; the page quotes its start.
    spec.check().map_err(|e| match AppError::from(e) {
        AppError::Invalid { field, reason } => {
            let input = match field.as_str() {
                "filter.queue" => spec.queue.as_deref(),
                "filter.type" => spec.job_type.as_deref(),
                _ => None,
            };
            let reason = match input { Some(i) => requoted(reason, i), None => reason };
            back(AppError::Invalid { field, reason })
        }
        other => other,
    })?;
    let store = crate::state::store()?;
    let (_, created) = store.put_replay_rule(&spec, &actor).await.map_err(|e| back(e.into()))?;
    let what = if created { "Created" } else { "Updated" };
    let state = if enabled { "the replayer applies it within seconds" } else { "it is disabled: it replays nothing until enabled" };
    Ok(format!("{what} replay rule {}; {state}.", spec.name))
}

/// `action`: `enable`, `disable` or `delete`.
#[server(endpoint = "act_on_replay_rule")]
pub async fn act_on_replay_rule(csrf: String, name: String, action: String) -> Result<String, AppError> {
    use rebound_queue::store::check_rule_name;

    let actor = crate::auth::authorize_mutation(&csrf)?;
    check_rule_name(&name)?;
    let store = crate::state::store()?;
    let missing = || AppError::NotFound(format!("replay rule {name}"));
    let enabled = match action.as_str() {
        "enable" => true,
        "disable" => false,
        "delete" => {
            return if store.delete_replay_rule(&name, &actor).await? {
                Ok(format!("Deleted replay rule {name}. The jobs it replayed keep their replay count."))
            } else {
                Err(missing())
            };
        }
        other => return Err(AppError::Invalid { field: "action".into(), reason: format!("unknown action {}; use enable, disable or delete", crate::error::quoted(other)) }),
    };
    // Only `enabled` changes: an edit made meanwhile elsewhere stands, and the rule keeps its
    // place among the dead letters.
    store.set_replay_rule_enabled(&name, enabled, &actor).await?;
    Ok(if enabled {
        format!("Replay rule {name} is enabled: the replayer applies it within seconds.")
    } else {
        format!("Replay rule {name} is disabled: it replays nothing until enabled again.")
    })
}

fn filter_part(label: &'static str, value: Option<String>) -> impl IntoView {
    let value = match value {
        Some(v) => view! { <code>{v}</code> }.into_any(),
        None => view! { <span class="muted">"any"</span> }.into_any(),
    };
    view! { <small class="muted">{label} " "</small> {value} }
}

fn text_field(input: &'static str, field: &'static str, label: &'static str, value: String, hint: String, problem: Memo<Option<String>>) -> impl IntoView {
    view! {
        <label class="field" class:invalid=move || problem.get().as_deref() == Some(field)>
            <span class="field-label">{label}</span>
            <input name=input value=value autocomplete="off"/>
            <small class="hint">{hint}</small>
        </label>
    }
}

#[component]
pub fn ReplayRulesPage() -> impl IntoView {
    let q = use_query_map();
    let edit = Memo::new(move |_| q.with(|q| q.get("edit").unwrap_or_default()));
    let typed = Memo::new(move |_| q.with(TypedRule::from_query));
    let tick = use_refresh();
    let save = ServerAction::<SaveReplayRule>::new();
    let act = ServerAction::<ActOnReplayRule>::new();
    let rules = Resource::new(move || (tick.get(), save.version().get(), act.version().get()), |_| replay_rules());
    // Not refreshed with the list, so a refresh never wipes what is being typed.
    let form = Resource::new(move || edit.get(), replay_rule_form);
    let can_act = use_can_act();
    view! {
        <p class="crumbs"><a href="/dead-letters">"Dead letters"</a> " / replay rules"</p>
        <h1>"Replay rules"</h1>
        <p class="lead">
            "A rule re-drives, with a fresh retry budget, the dead letters its filter matches (queue and type exactly, "
            "error type exactly or by a prefix such as " <code>"http.*"</code> "; an empty filter matches any) once they have been dead "
            "for its delay, and never sooner than one minute. A job is replayed at most " <em>"max replays"</em>
            " times in all, by whichever rules (its meta's " <code>"ojs.replay_count"</code> " counts them). "
            "The maintenance leader (a worker, or the server when no worker runs) applies enabled rules every few seconds. Changing a rule's filter or max replays "
            "makes it look at every existing dead letter again."
        </p>
        <ReadOnlyNote/>
        <ActionResult action=save/>
        <ActionResult action=act/>
        <Transition fallback=|| view! { <p class="muted">"Loading…"</p> }>
            {move || Suspend::new(async move {
                match rules.await {
                    Ok(rows) if rows.is_empty() => view! {
                        <p class="muted">"No replay rules: dead letters stay until someone re-drives them. Add a rule below."</p>
                    }.into_any(),
                    Ok(rows) => view! {
                        <table class="replay-rules">
                            <thead>
                                <tr>
                                    <th>"Name"</th><th>"Filter"</th><th>"Delay"</th><th class="num">"Max replays"</th><th>"Status"</th>
                                    <th class="num">"Replayed"</th><th>"Last replayed"</th><th></th>
                                </tr>
                            </thead>
                            <tbody>
                                {rows
                                    .into_iter()
                                    .map(|r| {
                                        let edit_href = format!("{PAGE}?edit={}", urlencode(&r.name));
                                        let (name_toggle, name_delete) = (r.name.clone(), r.name.clone());
                                        view! {
                                            <tr class:paused=!r.enabled data-rule=r.name.clone()>
                                                <td><strong>{r.name.clone()}</strong></td>
                                                <td class="filter">
                                                    {filter_part("queue", r.queue.clone())}<br/>
                                                    {filter_part("type", r.job_type.clone())}<br/>
                                                    {filter_part("error", r.error_type.clone())}
                                                </td>
                                                <td class="delay"><code>{r.delay.clone()}</code><br/><small class="muted">{r.delay_text.clone()}</small></td>
                                                <td class="num">{r.max_replays}</td>
                                                <td>
                                                    {if r.enabled {
                                                        view! { <span class="tag running">"enabled"</span> }.into_any()
                                                    } else {
                                                        view! { <span class="tag paused">"disabled"</span> }.into_any()
                                                    }}
                                                </td>
                                                <td class="num">{r.replayed_total}</td>
                                                <td class="last-replayed">
                                                    {match r.last_replayed.clone() {
                                                        Some(w) => view! { <span title=w.at.clone()>{w.relative}</span> }.into_any(),
                                                        None => view! { <span class="muted">"never"</span> }.into_any(),
                                                    }}
                                                </td>
                                                <td class="actions">
                                                    <a class="button-link" href=edit_href>"Edit"</a>
                                                    <ActionForm action=act>
                                                        <CsrfField/>
                                                        <input type="hidden" name="name" value=name_toggle/>
                                                        <input type="hidden" name="action" value=if r.enabled { "disable" } else { "enable" }/>
                                                        <button type="submit" disabled=move || !can_act.get()>{if r.enabled { "Disable" } else { "Enable" }}</button>
                                                    </ActionForm>
                                                    <ActionForm action=act>
                                                        <CsrfField/>
                                                        <input type="hidden" name="name" value=name_delete/>
                                                        <input type="hidden" name="action" value="delete"/>
                                                        <button type="submit" class="danger" disabled=move || !can_act.get()>"Delete"</button>
                                                    </ActionForm>
                                                </td>
                                            </tr>
                                        }
                                    })
                                    .collect_view()}
                            </tbody>
                        </table>
                    }
                    .into_any(),
                    Err(e) => view! { <ErrorBox error=e/> }.into_any(),
                }
            })}
        </Transition>
        <Transition fallback=|| view! { <p class="muted">"Loading…"</p> }>
            {move || Suspend::new(async move {
                match form.await {
                    Ok(f) => {
                        let f = match typed.get_untracked().filter(|_| crate::feedback::refused_for_values(save)) {
                            Some(t) => t.over(f),
                            None => f,
                        };
                        view! { <RuleEditor form=f save=save/> }.into_any()
                    }
                    Err(e) => view! { <ErrorBox error=e/> }.into_any(),
                }
            })}
        </Transition>
    }
}

#[component]
fn RuleEditor(form: RuleForm, save: ServerAction<SaveReplayRule>) -> impl IntoView {
    let can_act = use_can_act();
    // The field a refused save named, to mark it.
    let problem = Memo::new(move |_| save.value().get().and_then(|r| r.err()).and_then(|e| e.field().map(str::to_string)));
    let title = if form.editing { format!("Edit rule {}", form.name) } else { "New rule".to_string() };
    view! {
        <section class="panel editor replay-rule-editor">
            <h2>{title}</h2>
            {form.missing.then(|| view! { <p class="note missing-rule">"There is no replay rule of that name (any more): saving this form creates one."</p> })}
            <ActionForm action=save>
                <CsrfField/>
                <div class="field-grid">
                    {text_field("name", "name", "Name", form.name, "lowercase letters, digits, '.', '-', '_'; saving with an existing name replaces that rule".into(), problem)}
                    {text_field("queue", "filter.queue", "Queue", form.queue, "exact queue name; empty = any".into(), problem)}
                    {text_field("job_type", "filter.type", "Job type", form.job_type, "exact type; empty = any".into(), problem)}
                    {text_field("error_type", "filter.error_type", "Error type", form.error_type, "exact, or a prefix such as http.*; empty = any".into(), problem)}
                    {text_field("delay", "delay", "Delay", form.delay, "ISO-8601 time after death, e.g. PT30M, PT6H, P1D (at least one minute in effect)".into(), problem)}
                    {text_field("max_replays", "max_replays", "Max replays", form.max_replays, format!("per job, counting every rule's replays: 1 to {}", form.replays_limit), problem)}
                    <label class="field" class:invalid=move || problem.get().as_deref() == Some("enabled")>
                        <span class="field-label">"Status"</span>
                        <select name="enabled">
                            <option value="true" selected=form.enabled>"enabled"</option>
                            <option value="false" selected=!form.enabled>"disabled"</option>
                        </select>
                    </label>
                </div>
                <div class="buttons">
                    <button type="submit" class="primary" disabled=move || !can_act.get()>"Save rule"</button>
                    {form.editing.then(|| view! { <a class="button-link" href=PAGE>"New rule instead"</a> })}
                </div>
            </ActionForm>
        </section>
    }
}
