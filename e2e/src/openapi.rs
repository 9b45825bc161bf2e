//! Checks an API response against the collector's OpenAPI document: the schema the document
//! gives for that path, method and status must accept the body. Every object schema is closed
//! (`additionalProperties: false`) for the check, so a field the API returns but the document
//! does not describe fails too.

use serde_json::{Map, Value, json};

/// The document's path template that `path` (no query string) matches: `/api/v1/nodes/a/gpus/3`
/// → `/api/v1/nodes/{node}/gpus/{gpu}`.
pub fn template<'a>(doc: &'a Value, path: &str) -> Option<&'a str> {
    let want: Vec<&str> = path.split('/').collect();
    doc["paths"].as_object()?.keys().map(String::as_str).find(|t| {
        let parts: Vec<&str> = t.split('/').collect();
        parts.len() == want.len() && parts.iter().zip(&want).all(|(p, w)| p.starts_with('{') || p == w)
    })
}

fn close_objects(v: &mut Value) {
    match v {
        Value::Object(o) => {
            if o.contains_key("properties") && !o.contains_key("additionalProperties") {
                o.insert("additionalProperties".into(), Value::Bool(false));
            }
            o.values_mut().for_each(close_objects);
        }
        Value::Array(a) => a.iter_mut().for_each(close_objects),
        _ => {}
    }
}

/// Ok if `body` (answered with `status` to GET `path`) is what the document promises; else every
/// difference, by JSON pointer.
pub fn check(doc: &Value, path: &str, status: u16, body: &Value) -> Result<(), String> {
    let path = path.split('?').next().unwrap_or(path);
    let t = template(doc, path).ok_or_else(|| format!("{path}: no such path in the OpenAPI document"))?;
    let schema =
        doc["paths"][t]["get"]["responses"][status.to_string()]["content"]["application/json"]["schema"].clone();
    if schema.is_null() {
        return Err(format!("{t}: the document gives no JSON schema for status {status}"));
    }
    let mut components = doc["components"].clone();
    close_objects(&mut components);
    let mut schema = schema;
    close_objects(&mut schema);
    let mut root = Map::new();
    root.insert("$schema".into(), json!("https://json-schema.org/draft/2020-12/schema"));
    root.insert("components".into(), components);
    root.insert("allOf".into(), json!([schema]));
    let root = Value::Object(root);
    let validator = jsonschema::validator_for(&root).map_err(|e| format!("{t}: the document's schema: {e}"))?;
    let errors: Vec<String> = validator.iter_errors(body).map(|e| format!("{} at {}", e, e.instance_path())).collect();
    if errors.is_empty() { Ok(()) } else { Err(format!("{path} ({status}):\n  {}", errors.join("\n  "))) }
}
