//! One module per page; each keeps its server functions next to its components.

pub mod audit;
pub mod cron;
pub mod dead_letters;
pub mod job_detail;
pub mod jobs;
pub mod login;
pub mod overview;
pub mod policies;
pub mod policy_editor;
pub mod queues;
pub mod rate_limit_keys;
pub mod replay_rules;
pub mod workers;
pub mod workflows;

pub use audit::AuditPage;
pub use cron::CronPage;
pub use dead_letters::DeadLettersPage;
pub use job_detail::JobDetailPage;
pub use jobs::JobsPage;
pub use login::LoginPage;
pub use overview::OverviewPage;
pub use policies::PoliciesPage;
pub use policy_editor::PolicyEditorPage;
pub use queues::QueuesPage;
pub use replay_rules::ReplayRulesPage;
pub use workers::WorkersPage;
pub use workflows::{WorkflowPage, WorkflowsPage};
