//! The replication protocol between a leader and a follower (docs/adr/0020-high-availability.md
//! §3): length-prefixed messages, each a JSON header and a body of raw bytes (WAL frames, exactly
//! as the leader wrote them, or a file being copied), so a batch is shipped once and never
//! re-encoded.
//!
//! Frame: `u32 LE header length | header (JSON Message) | u32 LE body length | body`.

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::history::{EpochStart, Position};

/// The largest header or body accepted (a batch of 4096 records, or a copied segment's chunk).
pub const MAX_PART_BYTES: u32 = 256 << 20;

/// A message's header; its body travels beside it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "m", rename_all = "snake_case")]
pub enum Message {
    /// Leader → follower: the token, as the client protocol's `hello`, and the cell.
    Hello { token: String, cell: Option<u16> },
    /// Leader → follower: refuse every frame below `epoch` from now on; answered `Position`.
    Promise { epoch: u64 },
    /// Follower → leader: its log's position.
    Position { position: Position },
    /// Leader (taking over) → a more advanced replica: the frames after `after`, up to `upto`;
    /// answered `Frames` (body: the frames) until `upto` is reached, then `Done`.
    Fetch { after: u64, upto: u64 },
    /// A chunk of frames from `first` to `last` (body: the frames as written).
    Frames { first: u64, last: u64 },
    /// Leader → follower: follow `epoch`, which starts at `start`; the leader's log is `leader`.
    /// Answered `Joined` with the seq to stream from, or `Rebuild` when the follower's log is not
    /// a prefix of the leader's (or is too far behind).
    Join {
        epoch: u64,
        start: u64,
        leader: Position,
    },
    /// `epoch`: the last line of the follower's history (the leader's epoch once it holds
    /// every record before the epoch's start; the join then counts as an acknowledgement).
    Joined { last_seq: u64, epoch: u64 },
    /// Leader → follower: append these frames (body), of `epoch`, from `first` to `last`.
    Append { epoch: u64, first: u64, last: u64 },
    /// Follower → leader: every frame up to `seq` is fsynced; `epoch` is the last line of the
    /// follower's history (acknowledgements count only once it is the leader's epoch).
    Ack { seq: u64, epoch: u64 },
    /// Leader → follower: rebuild from the files that follow (`File` messages, then `Done`).
    Rebuild {
        epoch: u64,
        history: Vec<EpochStart>,
    },
    /// One file of a rebuild (body: its bytes).
    File { name: String },
    /// The end of a `Fetch` or a `Rebuild`.
    Done,
    /// Either side: refused, with the reason; the connection closes.
    Refused { reason: String },
}

/// Writes one message with its body.
pub async fn write<W: AsyncWrite + Unpin>(
    w: &mut W,
    message: &Message,
    body: &[u8],
) -> std::io::Result<()> {
    let header = serde_json::to_vec(message).map_err(std::io::Error::other)?;
    let mut out = Vec::with_capacity(8 + header.len() + body.len());
    out.extend_from_slice(&(header.len() as u32).to_le_bytes());
    out.extend_from_slice(&header);
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    out.extend_from_slice(body);
    w.write_all(&out).await?;
    w.flush().await
}

/// Reads one message and its body; `None` at a clean end of the stream.
pub async fn read<R: AsyncRead + Unpin>(r: &mut R) -> std::io::Result<Option<(Message, Vec<u8>)>> {
    let mut len = [0u8; 4];
    match r.read_exact(&mut len).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let header = read_part(r, u32::from_le_bytes(len)).await?;
    r.read_exact(&mut len).await?;
    let body = read_part(r, u32::from_le_bytes(len)).await?;
    let message = serde_json::from_slice(&header).map_err(std::io::Error::other)?;
    Ok(Some((message, body)))
}

async fn read_part<R: AsyncRead + Unpin>(r: &mut R, len: u32) -> std::io::Result<Vec<u8>> {
    if len > MAX_PART_BYTES {
        return Err(std::io::Error::other(format!("a part of {len} bytes")));
    }
    let mut buf = vec![0u8; len as usize];
    r.read_exact(&mut buf).await?;
    Ok(buf)
}
