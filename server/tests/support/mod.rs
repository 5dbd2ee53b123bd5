//! What the in-process gRPC tests share: the real server (`server::run`) on
//! 127.0.0.1:0 with the tiny model on the CPU, a tonic client, and helpers to
//! build requests and collect whole streams.
//!
//! Each test binary (`grpc`, `grpc_controls`) uses its own subset.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::time::Duration;

use clap::Parser;
use ember_common::pb::{self, generate_response::Event, inference_client::InferenceClient};
use ember_server::cli::Args;
use ember_testkit::health;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tonic::transport::Channel;
use tonic_health::pb::health_check_response::ServingStatus;

pub struct TestServer {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<anyhow::Result<()>>>,
}

impl TestServer {
    /// Starts the server without waiting for it to be ready.
    pub async fn spawn(extra: &[&str]) -> Self {
        let mut args = vec![
            "ember-server",
            "--preset",
            "tiny",
            "--device",
            "cpu",
            "--listen",
            "127.0.0.1:0",
        ];
        args.extend_from_slice(extra);
        let config = Args::try_parse_from(args).unwrap().validate().unwrap();
        let listener = TcpListener::bind(config.listen).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stop_rx) = oneshot::channel::<()>();
        let task = tokio::spawn(ember_server::server::run(config, listener, async {
            let _ = stop_rx.await;
        }));
        Self {
            addr,
            stop: Some(stop),
            task: Some(task),
        }
    }

    /// Starts the server and waits until it is SERVING.
    pub async fn start(extra: &[&str]) -> Self {
        let server = Self::spawn(extra).await;
        server.wait_serving().await;
        server
    }

    pub async fn channel(&self) -> Channel {
        Channel::from_shared(format!("http://{}", self.addr))
            .unwrap()
            .connect()
            .await
            .unwrap()
    }

    pub async fn client(&self) -> InferenceClient<Channel> {
        InferenceClient::new(self.channel().await)
    }

    pub async fn health(&self) -> ServingStatus {
        let endpoint = health::endpoint(&format!("http://{}", self.addr)).unwrap();
        health::check(&endpoint, ember_common::SERVICE_NAME)
            .await
            .unwrap()
    }

    pub async fn wait_serving(&self) {
        let target = format!("http://{}", self.addr);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        if let Err(e) = health::wait_serving(&target, &[""], deadline, || None).await {
            panic!("server never became SERVING: {e}");
        }
    }

    pub async fn info(&self) -> pb::ServerInfo {
        self.client()
            .await
            .get_server_info(pb::GetServerInfoRequest {})
            .await
            .unwrap()
            .into_inner()
    }

    /// KV blocks and active sequences drop to 0 (release is asynchronous to the
    /// client seeing the stream end).
    pub async fn assert_idle(&self) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(4);
        let every = Duration::from_millis(20);
        if let Err(last) =
            health::wait_info(self.channel().await, every, deadline, health::is_idle).await
        {
            panic!("server not idle: {last}");
        }
    }

    pub async fn stop(mut self) {
        let _ = self.stop.take().unwrap().send(());
        self.task.take().unwrap().await.unwrap().unwrap();
    }
}

pub fn request(prompt: &str, n: u32) -> pb::GenerateRequest {
    pb::GenerateRequest {
        prompt: prompt.into(),
        max_new_tokens: n,
        ignore_eos: true,
        ..Default::default()
    }
}

/// Collects a whole stream: (started, tokens, finished).
pub async fn collect(
    client: &mut InferenceClient<Channel>,
    req: pb::GenerateRequest,
) -> Result<(pb::Started, Vec<pb::Token>, pb::Finished), tonic::Status> {
    let mut stream = client.generate(req).await?.into_inner();
    let mut started = None;
    let mut tokens = Vec::new();
    while let Some(msg) = stream.message().await? {
        match msg.event.unwrap() {
            Event::Started(s) => started = Some(s),
            Event::Token(t) => tokens.push(t),
            Event::Finished(f) => return Ok((started.unwrap(), tokens, f)),
            Event::PromptLogprobs(_) => {}
        }
    }
    panic!("stream ended without Finished");
}

/// Every message of a whole stream (to its end), by kind.
#[derive(Debug, Default)]
pub struct Whole {
    pub started: Vec<pb::Started>,
    pub prompt_logprobs: Vec<pb::PromptLogprobs>,
    pub tokens: Vec<pb::Token>,
    pub finished: Vec<pb::Finished>,
}

/// Reads a stream to its end (several `Finished` with n > 1).
pub async fn collect_all(
    client: &mut InferenceClient<Channel>,
    req: pb::GenerateRequest,
) -> Result<Whole, tonic::Status> {
    let mut stream = client.generate(req).await?.into_inner();
    let mut w = Whole::default();
    while let Some(msg) = stream.message().await? {
        match msg.event.unwrap() {
            Event::Started(s) => w.started.push(s),
            Event::PromptLogprobs(p) => w.prompt_logprobs.push(p),
            Event::Token(t) => w.tokens.push(t),
            Event::Finished(f) => w.finished.push(f),
        }
    }
    Ok(w)
}
