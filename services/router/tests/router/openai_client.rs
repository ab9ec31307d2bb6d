//! A small HTTP/1.1 client for the router's OpenAI-compatible API: JSON in, JSON or
//! server-sent events out.

use std::net::SocketAddr;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::{Method, Request, StatusCode};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;

pub struct OpenAi {
    addr: SocketAddr,
    client: Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>,
}

impl OpenAi {
    pub fn new(addr: SocketAddr) -> Self {
        Self {
            addr,
            client: Client::builder(TokioExecutor::new()).build_http(),
        }
    }

    async fn call(&self, method: Method, path: &str, body: Option<&Value>) -> (StatusCode, Bytes) {
        let body = body.map_or_else(Bytes::new, |b| Bytes::from(b.to_string()));
        let request = Request::builder()
            .method(method)
            .uri(format!("http://{}{path}", self.addr))
            .header("content-type", "application/json")
            .body(Full::new(body))
            .unwrap();
        let response = self.client.request(request).await.unwrap();
        let status = response.status();
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        (status, bytes)
    }

    /// POSTs `body`; the status and the JSON answer.
    pub async fn post(&self, path: &str, body: &Value) -> (StatusCode, Value) {
        let (status, bytes) = self.call(Method::POST, path, Some(body)).await;
        let value = serde_json::from_slice(&bytes)
            .unwrap_or_else(|e| panic!("{path}: not JSON ({e}): {bytes:?}"));
        (status, value)
    }

    /// POSTs a raw body.
    pub async fn post_raw(&self, path: &str, body: &'static str) -> (StatusCode, Value) {
        let request = Request::builder()
            .method(Method::POST)
            .uri(format!("http://{}{path}", self.addr))
            .body(Full::new(Bytes::from_static(body.as_bytes())))
            .unwrap();
        let response = self.client.request(request).await.unwrap();
        let status = response.status();
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        (status, serde_json::from_slice(&bytes).unwrap())
    }

    pub async fn get(&self, path: &str) -> (StatusCode, Value) {
        let (status, bytes) = self.call(Method::GET, path, None).await;
        (status, serde_json::from_slice(&bytes).unwrap())
    }

    /// POSTs a streaming request; every `data:` payload in order (`[DONE]` as a string).
    pub async fn stream(&self, path: &str, body: &Value) -> (StatusCode, Vec<Value>) {
        let (status, bytes) = self.call(Method::POST, path, Some(body)).await;
        let text = String::from_utf8(bytes.to_vec()).unwrap();
        let events = text
            .split("\n\n")
            .filter_map(|event| {
                let data: Vec<&str> = event
                    .lines()
                    .filter_map(|line| line.strip_prefix("data:"))
                    .map(|d| d.strip_prefix(' ').unwrap_or(d))
                    .collect();
                (!data.is_empty()).then(|| data.join("\n"))
            })
            .map(|data| match data.as_str() {
                "[DONE]" => Value::String(data),
                json => serde_json::from_str(json).unwrap_or_else(|e| panic!("{e}: {json}")),
            })
            .collect();
        (status, events)
    }
}
