//! A script call (`EVALSHA`) written straight into one command buffer.
//!
//! redis-rs's `ScriptInvocation` keeps each key and argument in a buffer of its own and copies
//! them into the command when it is sent: about ten allocations for a claim or a mark, on the
//! path every first execution takes. An [`Eval`] writes the command once, sized ahead, and loads
//! the script when the server does not have it (`NOSCRIPT`), as `ScriptInvocation` does.

use redis::aio::ConnectionLike;
use redis::{Cmd, ErrorKind, FromRedisValue, RedisResult, Script, ServerErrorKind, ToRedisArgs};

pub(super) struct Eval<'a> {
    script: &'a Script,
    cmd: Cmd,
}

impl<'a> Eval<'a> {
    /// `EVALSHA` of `script` with `keys` keys, then `args` more arguments to come; `bytes`: about
    /// how long the keys and arguments are together (the buffer is sized for it).
    pub(super) fn new(script: &'a Script, keys: usize, args: usize, bytes: usize) -> Self {
        let mut cmd = Cmd::with_capacity(3 + keys + args, 64 + bytes + 16 * (keys + args));
        cmd.arg("EVALSHA").arg(script.get_hash()).arg(keys);
        Eval { script, cmd }
    }

    /// The next key or argument, in the order the script reads them (`KEYS`, then `ARGV`).
    pub(super) fn arg<T: ToRedisArgs>(&mut self, arg: T) -> &mut Self {
        self.cmd.arg(arg);
        self
    }

    /// Sends the call; a server that does not know the script has it loaded, then runs it.
    pub(super) async fn invoke<T: FromRedisValue>(
        &self,
        conn: &mut impl ConnectionLike,
    ) -> RedisResult<T> {
        match self.cmd.query_async(conn).await {
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                self.script.load_async(conn).await?;
                self.cmd.query_async(conn).await
            }
            done => done,
        }
    }
}
