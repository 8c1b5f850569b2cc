//! The `/metrics` endpoint as Prometheus reads it: one plain HTTP GET, and the text exposition
//! parsed into series.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::SocketAddr,
};

/// One GET over plain HTTP/1.1 (`Connection: close`): the status code and the body.
pub async fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    let (head, body) = response
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("not an HTTP response: {response:?}"));
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    (status, body.to_owned())
}

/// A parsed Prometheus text exposition: series name → (labels → value).
pub struct Scrape {
    series: Vec<(String, BTreeMap<String, String>, f64)>,
}

impl Scrape {
    /// `GET /metrics` on `addr`, parsed.
    pub async fn fetch(addr: SocketAddr) -> Self {
        let (status, body) = http_get(addr, "/metrics").await;
        assert_eq!(status, 200, "{body}");
        Self::parse(&body)
    }

    /// Parses the text format (one sample per line; label values without escapes).
    pub fn parse(text: &str) -> Self {
        let mut series = Vec::new();
        for line in text
            .lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
        {
            let (name_labels, value) = line.rsplit_once(' ').unwrap();
            let value: f64 = value.parse().unwrap();
            let (name, labels) = match name_labels.split_once('{') {
                Some((name, rest)) => (name, rest.strip_suffix('}').unwrap()),
                None => (name_labels, ""),
            };
            let labels = labels
                .split(',')
                .filter(|kv| !kv.is_empty())
                .map(|kv| {
                    let (k, v) = kv.split_once('=').unwrap();
                    (k.to_owned(), v.trim_matches('"').to_owned())
                })
                .collect();
            series.push((name.to_owned(), labels, value));
        }
        Self { series }
    }

    /// Every series of `name` as (labels, value).
    pub fn series(&self, name: &str) -> impl Iterator<Item = (&BTreeMap<String, String>, f64)> {
        self.series
            .iter()
            .filter(move |(n, _, _)| n == name)
            .map(|(_, labels, value)| (labels, *value))
    }

    /// The value of the series of `name` whose labels include `labels` (summed over the rest).
    pub fn sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.series(name)
            .filter(|(l, _)| {
                labels
                    .iter()
                    .all(|(k, v)| l.get(*k).map(String::as_str) == Some(*v))
            })
            .map(|(_, v)| v)
            .sum()
    }

    /// `oncegate_budget_decisions_total` of `budget` for one decision (`reserved`, `exceeded`) in
    /// one mode (`enforce`, `shadow`).
    pub fn budget(&self, budget: &str, decision: &str, mode: &str) -> f64 {
        self.sum(
            "oncegate_budget_decisions_total",
            &[("budget", budget), ("decision", decision), ("mode", mode)],
        )
    }

    /// Every series name in the scrape.
    pub fn names(&self) -> BTreeSet<&str> {
        self.series.iter().map(|(n, _, _)| n.as_str()).collect()
    }
}
