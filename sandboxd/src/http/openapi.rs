//! What the OpenAPI documents of both surfaces share: the binary body schema, the walk over a
//! document's operations, and how a document is printed and served. Each surface owns its
//! document: [`crate::http::v1::openapi`] (`/openapi.json`) and [`crate::http::wire::openapi`]
//! (`/wire/openapi.json`).

use utoipa::ToSchema;
use utoipa::openapi::path::Operation;
use utoipa::openapi::{ContentBuilder, OpenApi as Document, Ref, RefOr, Response, ResponseBuilder};

/// Bytes as they are (a file's content).
#[derive(ToSchema)]
#[schema(value_type = String, format = Binary)]
pub struct Binary(#[allow(dead_code)] Vec<u8>);

/// An error response of a route: `description`, and a JSON body of the surface's error schema
/// `schema`.
pub(crate) fn error_response(description: impl Into<String>, schema: &str) -> RefOr<Response> {
    ResponseBuilder::new()
        .description(description)
        .content(
            "application/json",
            ContentBuilder::new()
                .schema(Some(Ref::from_schema_name(schema)))
                .build(),
        )
        .into()
}

/// Calls `f` with "METHOD /path" and the operation, for every operation of `doc`.
pub(crate) fn each_operation(doc: &mut Document, mut f: impl FnMut(&str, &mut Operation)) {
    for (path, item) in doc.paths.paths.iter_mut() {
        let operations = [
            ("GET", &mut item.get),
            ("PUT", &mut item.put),
            ("POST", &mut item.post),
            ("DELETE", &mut item.delete),
            ("PATCH", &mut item.patch),
            ("HEAD", &mut item.head),
            ("OPTIONS", &mut item.options),
        ];
        for (method, operation) in operations {
            if let Some(operation) = operation {
                f(&format!("{method} {path}"), operation);
            }
        }
    }
}

/// A document as pretty JSON with a final newline, as it is served and committed.
pub(crate) fn pretty(doc: &Document) -> String {
    match doc.to_pretty_json() {
        Ok(text) => text + "\n",
        // Serializing a document of strings and maps cannot fail.
        Err(e) => format!("{{\"error\": \"{e}\"}}\n"),
    }
}

/// A document's text as a JSON response.
pub(crate) fn serve(text: String) -> axum::response::Response {
    use axum::response::IntoResponse;
    (
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        text,
    )
        .into_response()
}

/// "METHOD /path" of every operation of a document.
#[cfg(test)]
pub(crate) fn routes(doc: &Document) -> std::collections::BTreeSet<String> {
    let mut doc = doc.clone();
    let mut routes = std::collections::BTreeSet::new();
    each_operation(&mut doc, |route, _| {
        routes.insert(route.to_owned());
    });
    routes
}
