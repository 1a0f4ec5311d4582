use hyper::StatusCode;
use serde::Serialize;

/// An error as the API reports it: an HTTP status and OpenAI's error object,
/// `{"error": {"message", "type", "param", "code"}}`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiError {
    /// The HTTP status.
    pub status: StatusCode,
    /// What went wrong, for a person.
    pub message: String,
    /// OpenAI's error type, such as `invalid_request_error`.
    pub kind: &'static str,
    /// The request parameter at fault, if one is.
    pub param: Option<String>,
    /// Seconds a client should wait before retrying, sent as `Retry-After`.
    pub retry_after: Option<u32>,
}

#[derive(Serialize)]
struct Body<'a> {
    error: Object<'a>,
}

#[derive(Serialize)]
struct Object<'a> {
    message: &'a str,
    #[serde(rename = "type")]
    kind: &'a str,
    param: Option<&'a str>,
    code: u16,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            kind,
            param: None,
            retry_after: None,
        }
    }

    /// 400: the request is malformed or asks for something this server does not do.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }

    /// 400 about parameter `param`.
    pub fn invalid_param(param: &str, message: impl Into<String>) -> Self {
        Self {
            param: Some(param.to_owned()),
            ..Self::invalid(message)
        }
    }

    /// 401: a missing or wrong API key.
    pub fn unauthorized() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "authentication_error",
            "invalid API key: send it as `Authorization: Bearer KEY`",
        )
    }

    /// 404: no such route.
    pub fn not_found(method: &str, path: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "not_found_error",
            format!("no route for {method} {path}"),
        )
    }

    /// 405: the route exists for other methods.
    pub fn method_not_allowed(method: &str, path: &str) -> Self {
        Self::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "invalid_request_error",
            format!("{path} does not take {method}"),
        )
    }

    /// 413: the body is longer than the limit.
    pub fn too_large(limit: usize) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            format!("the request body is longer than the limit of {limit} bytes"),
        )
    }

    /// 503 with `Retry-After`: the queue is full or the server is loading or stopping.
    pub fn unavailable(message: impl Into<String>, retry_after: u32) -> Self {
        Self {
            retry_after: Some(retry_after),
            ..Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable_error",
                message,
            )
        }
    }

    /// 500: the engine failed on a well-formed request.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", message)
    }

    /// The JSON body.
    pub fn to_json(&self) -> String {
        serde_json::to_string(&Body {
            error: Object {
                message: &self.message,
                kind: self.kind,
                param: self.param.as_deref(),
                code: self.status.as_u16(),
            },
        })
        .expect("an error object serializes")
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.status.as_u16(), self.message)
    }
}

impl std::error::Error for ApiError {}
