//! The fallback run path: Docker exec (`SANDBOXD_RUN_BACKEND=exec`), and the run path of a
//! container whose PID 1 is not the agent.

use super::*;
use std::time::{Duration, Instant};

use bollard::container::LogOutput;
use bollard::exec::{CreateExecOptions, StartExecOptions, StartExecResults};
use futures::StreamExt;
use futures::future::BoxFuture;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::container::docker::DockerEngine;
use crate::container::{Engine, WORKSPACE_MOUNT};

/// Prints the shell's pid on the first stdout line, then becomes the command. The pid is the
/// run's process group (Docker starts each exec as a session leader), which stop and timeout kill.
pub(super) const WRAPPER: &str = "printf '%s\\n' \"$$\"; exec /bin/sh -c \"$1\"";

/// How long output may keep flowing after the run's group was killed.
pub(super) const KILL_GRACE: Duration = Duration::from_millis(1500);

/// How long Docker may take to report a run's exit once its output was read.
pub(super) const IO_WAIT: Duration = Duration::from_secs(10);

/// Runs commands with Docker exec.
#[derive(Clone)]
pub struct ExecRunner {
    engine: Engine,
    /// Where runs are counted by path (`exec`) when this is the configured backend; none when
    /// it is the agent's fallback, which counts its own (`exec_fallback`).
    metrics: Option<std::sync::Arc<crate::metrics::Metrics>>,
}

impl ExecRunner {
    /// A runner on `engine` (the agent runner's fallback).
    pub fn new(engine: Engine) -> Self {
        Self {
            engine,
            metrics: None,
        }
    }

    /// The configured backend: a runner on `engine` that counts its runs as path `exec`.
    pub fn counted(engine: Engine, metrics: std::sync::Arc<crate::metrics::Metrics>) -> Self {
        Self {
            engine,
            metrics: Some(metrics),
        }
    }

    pub(super) async fn kill_group(&self, container: &str, pid: u32, uid: u32) {
        if pid < 2 {
            return;
        }
        // POSIX kill (dash has no `--`): a negative pid is the process group. Then wait, on
        // shell builtins only (the group may hold every pid the limit allows), until the group
        // is gone, so a stopped or timed-out run leaves nothing behind when it returns.
        let script = "kill -KILL \"-$1\" 2>/dev/null || kill -KILL \"$1\" 2>/dev/null; \
             i=0; while kill -0 \"-$1\" 2>/dev/null && [ $i -lt 200000 ]; do i=$((i+1)); done; true";
        let options = CreateExecOptions {
            cmd: Some(vec![
                "/bin/sh".to_owned(),
                "-c".to_owned(),
                script.to_owned(),
                "kill".to_owned(),
                pid.to_string(),
            ]),
            user: Some(format!("{uid}:{uid}")),
            attach_stdout: Some(true),
            attach_stderr: Some(true),
            ..Default::default()
        };
        let Ok(docker) = self.engine.docker().map(DockerEngine::client) else {
            return;
        };
        let Ok(exec) = docker.create_exec(container, options).await else {
            return;
        };
        if let Ok(StartExecResults::Attached { mut output, .. }) =
            docker.start_exec(&exec.id, None::<StartExecOptions>).await
        {
            while output.next().await.is_some() {}
        }
    }

    /// The exit code of exec `exec_id`: 124 timed out, 137 stopped (ours to say), else
    /// Docker's word; a run killed by a signal also takes what is left of its process group.
    async fn exit_code(
        &self,
        docker: &bollard::Docker,
        exec_id: &str,
        ended_by: Option<Ended>,
        pid: Option<u32>,
        spec: &RunSpec,
    ) -> Result<i64, RunError> {
        // A stopped or timed-out run's status is ours to say; only a run that ended by
        // itself needs Docker's word.
        let exited = match tokio::time::timeout(IO_WAIT, docker.inspect_exec(exec_id)).await {
            Ok(Ok(inspected)) => inspected.exit_code,
            Ok(Err(e)) if ended_by.is_none() => return Err(RunError::Stream(e.to_string())),
            Err(_) if ended_by.is_none() => {
                return Err(RunError::Stream(
                    "docker did not report the run's exit".into(),
                ));
            }
            _ => None,
        };
        // A run killed by a signal (the OOM killer, a fork bomb hitting the pids limit) takes
        // what is left of its process group with it; a run that exits leaves its background jobs.
        if let Some(pid) = pid
            && ended_by.is_none()
            && exited.is_some_and(|c| c >= 128)
        {
            self.kill_group(&spec.container, pid, spec.uid).await;
        }
        Ok(match ended_by {
            Some(Ended::Timeout) => 124,
            Some(Ended::Stopped) => 137,
            None => exited.unwrap_or(-1),
        })
    }

    pub(super) async fn run_exec(
        &self,
        spec: RunSpec,
        events: Option<mpsc::Sender<RunEvent>>,
        cancel: CancellationToken,
    ) -> Result<RunOutcome, RunError> {
        let started = Instant::now();
        let docker = self
            .engine
            .docker()
            .map_err(|e| RunError::Start(e.to_string()))?
            .client();
        let options = exec_options(&spec);
        let exec = docker
            .create_exec(&spec.container, options)
            .await
            .map_err(|e| match e {
                bollard::errors::Error::DockerResponseServerError {
                    status_code: 409, ..
                } => RunError::NotRunning,
                e => RunError::Start(e.to_string()),
            })?;
        let StartExecResults::Attached { mut output, .. } = docker
            .start_exec(&exec.id, None::<StartExecOptions>)
            .await
            .map_err(|e| RunError::Start(e.to_string()))?
        else {
            return Err(RunError::Start("docker started the exec detached".into()));
        };
        if let Some(m) = &self.metrics {
            m.observe_run_start("exec", started);
        }

        let mut captured = Output::new(spec.max_output_bytes, events);
        let mut pid: Option<u32> = None;
        let mut pid_line = Vec::new();
        let deadline = tokio::time::sleep(spec.timeout);
        tokio::pin!(deadline);
        // After a kill, output still held open by an escaped process is not waited for.
        let grace = tokio::time::sleep(Duration::from_secs(86400 * 365));
        tokio::pin!(grace);
        let mut ended_by = None;
        // The kill runs beside the loop, which reads on: dockerd (20.10) handles an exec's
        // exit only once its output is copied out, one exit per container at a time, so a
        // loop that stopped reading to wait for the kill would wait for ever.
        let mut killing: Option<tokio::task::JoinHandle<()>> = None;
        let kill = |pid: u32| {
            let (runner, container, uid) = (self.clone(), spec.container.clone(), spec.uid);
            tokio::spawn(async move { runner.kill_group(&container, pid, uid).await })
        };
        loop {
            tokio::select! {
                chunk = output.next() => match chunk {
                    None => break,
                    Some(Err(e)) => return Err(RunError::Stream(e.to_string())),
                    Some(Ok(LogOutput::StdOut { message })) => {
                        let mut bytes = &message[..];
                        if pid.is_none() {
                            // The wrapper's first line is the pid, not output.
                            match bytes.iter().position(|b| *b == b'\n') {
                                Some(i) => {
                                    pid_line.extend_from_slice(&bytes[..i]);
                                    pid = std::str::from_utf8(&pid_line).ok().and_then(|s| s.trim().parse().ok()).or(Some(0));
                                    bytes = &bytes[i + 1..];
                                    // Stopped or timed out before its pid was known: kill now.
                                    if ended_by.is_some() {
                                        killing = Some(kill(pid.unwrap_or(0)));
                                    }
                                }
                                None => { pid_line.extend_from_slice(bytes); continue; }
                            }
                        }
                        if !bytes.is_empty() {
                            captured.stdout(bytes);
                        }
                    }
                    Some(Ok(LogOutput::StdErr { message })) => captured.stderr(&message),
                    Some(Ok(_)) => {}
                },
                // Output that waited for a slow consumer goes out when it has room; the loop
                // itself never waits for it.
                () = captured.room(), if captured.waiting() => captured.send_waiting(),
                () = &mut deadline, if ended_by.is_none() => {
                    ended_by = Some(Ended::Timeout);
                    killing = pid.map(kill);
                }
                () = cancel.cancelled(), if ended_by.is_none() => {
                    ended_by = Some(Ended::Stopped);
                    killing = pid.map(kill);
                }
                _ = async { if let Some(k) = killing.as_mut() { let _ = k.await; } }, if killing.is_some() => {
                    // The group is gone: what output is still held open is not waited for long.
                    killing = None;
                    grace.as_mut().reset(tokio::time::Instant::now() + KILL_GRACE);
                }
                () = &mut grace => break,
            }
        }
        // Closing the attach lets dockerd finish the exec even when an escaped process still
        // holds its output open (dockerd waits for the copy before it reports the exit).
        drop(output);
        if let Some(k) = killing {
            let _ = k.await;
        }
        let exit_code = self
            .exit_code(docker, &exec.id, ended_by, pid, &spec)
            .await?;
        let truncated = captured.truncated();
        let (stdout, stderr) = captured.finish();
        Ok(RunOutcome {
            run_id: spec.run_id,
            exit_code,
            truncated,
            stdout,
            stderr,
            timed_out: ended_by == Some(Ended::Timeout),
            stopped: ended_by == Some(Ended::Stopped),
            duration_ms: started.elapsed().as_millis() as u64,
            cpu_ns: None,
        })
    }
}

/// The exec of a run: the wrapper (which prints the pid first) running the command as the
/// sandbox's user in the workspace, its output attached.
fn exec_options(spec: &RunSpec) -> CreateExecOptions<String> {
    CreateExecOptions {
        cmd: Some(vec![
            "/bin/sh".to_owned(),
            "-c".to_owned(),
            WRAPPER.to_owned(),
            "sandboxd-run".to_owned(),
            spec.command.clone(),
        ]),
        env: Some(spec.env.clone()),
        user: Some(format!("{0}:{0}", spec.uid)),
        working_dir: Some(WORKSPACE_MOUNT.to_owned()),
        attach_stdout: Some(true),
        attach_stderr: Some(true),
        ..Default::default()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Ended {
    Timeout,
    Stopped,
}

impl Runner for ExecRunner {
    fn run<'a>(
        &'a self,
        spec: RunSpec,
        events: Option<mpsc::Sender<RunEvent>>,
        cancel: CancellationToken,
    ) -> BoxFuture<'a, Result<RunOutcome, RunError>> {
        if let Some(m) = &self.metrics {
            m.run_path("exec");
        }
        Box::pin(self.run_exec(spec, events, cancel))
    }

    fn taken<'a>(
        &'a self,
        _session: &'a str,
        container: &'a str,
    ) -> BoxFuture<'a, Result<bool, String>> {
        Box::pin(async move {
            self.engine
                .running(container)
                .await
                .map(|r| r == Some(true))
                .map_err(|e| e.to_string())
        })
    }
}
