//! The uniqueness fingerprint of a job (`ojs-unique-jobs.md` §3–4): which envelope dimensions
//! count (`type` always, plus `queue`, `args`, `meta`), narrowed to chosen args fields
//! (`args_keys`) and meta fields (`meta_keys`), canonicalised and hashed.

use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use crate::job::{JobValidationError, NewJob};

/// The dimensions a fingerprint may name.
pub const DIMENSIONS: [&str; 4] = ["type", "queue", "args", "meta"];

/// What makes two jobs the same work. Errors name fields relative to `options.unique`
/// (`keys`, `args_keys[1]`, `meta_keys`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Fingerprint {
    /// Dimensions from [`DIMENSIONS`]; empty means the default (`type`, `queue`, `args`, or
    /// `type` and `args` when `args_keys` narrows the args).
    pub dimensions: Vec<String>,
    /// Only these fields of the args' object count. Args are a JSON array; a field is looked up
    /// in its object items (the SDKs send keyword arguments as `[{…}]`). Naming fields implies
    /// the `args` dimension.
    pub args_keys: Option<Vec<String>>,
    /// The meta fields that count; required when `meta` is a dimension (all of meta would make
    /// every job unique: it carries trace ids and the like).
    pub meta_keys: Option<Vec<String>>,
}

impl Fingerprint {
    /// The hex SHA-256 of the canonical JSON of the selected dimensions.
    pub fn key(&self, job: &NewJob) -> Result<String, JobValidationError> {
        let mut dims: Vec<&str> = Vec::new();
        for d in &self.dimensions {
            match DIMENSIONS.iter().find(|known| **known == d.as_str()) {
                Some(known) => dims.push(known),
                None => {
                    return Err(JobValidationError::new("keys", format!("unknown key {d:?}; use type, queue, args or meta")));
                }
            }
        }
        if dims.is_empty() {
            dims = if self.args_keys.is_some() { vec!["type", "args"] } else { vec!["type", "queue", "args"] };
        }
        dims.push("type");
        if self.args_keys.is_some() {
            dims.push("args");
        }
        let mut canonical = Map::new();
        for dim in dims {
            let value = match dim {
                "type" => Value::String(job.job_type.clone()),
                "queue" => Value::String(job.queue.clone()),
                "args" => match &self.args_keys {
                    None => job.args.clone(),
                    Some(fields) => Value::Object(select_args(&job.args, fields)?),
                },
                _ => Value::Object(self.select_meta(&job.meta)?),
            };
            canonical.insert(dim.to_owned(), value);
        }
        // serde_json keeps object keys sorted (no preserve_order), so this text is canonical.
        let text = Value::Object(canonical).to_string();
        Ok(hex::encode(Sha256::digest(text.as_bytes())))
    }

    fn select_meta(&self, meta: &Value) -> Result<Map<String, Value>, JobValidationError> {
        let fields = match &self.meta_keys {
            Some(f) if !f.is_empty() => f,
            _ => return Err(JobValidationError::new("meta_keys", "is required when keys includes \"meta\": name the meta fields that make a job unique")),
        };
        Ok(fields.iter().map(|k| (k.clone(), meta.get(k).cloned().unwrap_or(Value::Null))).collect())
    }
}

/// The named fields from the object items of `args`, each from the first item that has it.
fn select_args(args: &Value, fields: &[String]) -> Result<Map<String, Value>, JobValidationError> {
    if fields.is_empty() {
        return Err(JobValidationError::new("args_keys", "must name at least one args field"));
    }
    let items: Vec<&Map<String, Value>> = match args {
        Value::Array(items) => items.iter().filter_map(Value::as_object).collect(),
        Value::Object(m) => vec![m],
        _ => Vec::new(),
    };
    let mut out = Map::new();
    for (i, field) in fields.iter().enumerate() {
        match items.iter().find_map(|m| m.get(field)) {
            Some(v) => {
                out.insert(field.clone(), v.clone());
            }
            None => {
                return Err(JobValidationError::new(
                    format!("args_keys[{i}]"),
                    format!("the job's args have no field {field:?} (args_keys name fields of an object in args)"),
                ));
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn job(args: Value) -> NewJob {
        NewJob::new("uniq.t", args)
    }

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn args_keys_narrow_the_args() {
        let by_id = Fingerprint { args_keys: Some(strings(&["id"])), ..Default::default() };
        let a = by_id.key(&job(json!([{"id": 7, "x": 1}]))).unwrap();
        assert_eq!(a, by_id.key(&job(json!([{"x": 2, "id": 7}]))).unwrap(), "x does not count");
        assert_ne!(a, by_id.key(&job(json!([{"id": 8, "x": 1}]))).unwrap());
        let whole = Fingerprint { dimensions: strings(&["type", "args"]), ..Default::default() };
        assert_ne!(whole.key(&job(json!([{"id": 7, "x": 1}]))).unwrap(), whole.key(&job(json!([{"id": 7, "x": 2}]))).unwrap());
        let e = by_id.key(&job(json!([{"x": 1}]))).unwrap_err();
        assert_eq!(e.field, "args_keys[0]");
    }

    #[test]
    fn meta_needs_meta_keys_and_type_always_counts() {
        let meta = Fingerprint { dimensions: strings(&["meta"]), ..Default::default() };
        assert_eq!(meta.key(&job(json!([]))).unwrap_err().field, "meta_keys");
        let tenant = Fingerprint { dimensions: strings(&["meta"]), meta_keys: Some(strings(&["tenant"])), ..Default::default() };
        let mut a = job(json!([]));
        a.meta = json!({"tenant": "acme", "trace": 1});
        let mut b = a.clone();
        b.meta = json!({"tenant": "acme", "trace": 2});
        assert_eq!(tenant.key(&a).unwrap(), tenant.key(&b).unwrap());
        b.job_type = "other.t".into();
        assert_ne!(tenant.key(&a).unwrap(), tenant.key(&b).unwrap(), "type is always part of the key");
        let bad = Fingerprint { dimensions: strings(&["argz"]), ..Default::default() };
        assert_eq!(bad.key(&a).unwrap_err().field, "keys");
    }
}
