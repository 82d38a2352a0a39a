// Package proto is Ferry's wire protocol: the gRPC service Ferry, generated
// from ferry.proto, and the conversions between wire and ferry types.
//
// All calls of a client share one TLS 1.3 connection (HTTP/2 streams), so
// many calls are in flight at once and none waits for another's reply. The
// calls mirror ferry.Tree and ferry.Finder:
//
//   - Stat(PathReq) returns DirReply.
//   - Get(GetReq{path, offset, count}) streams Data messages of at most
//     MaxData bytes until count bytes or the end of the file.
//   - Put is a client stream: its first PutMsg carries path, offset
//     (-1 replaces the file atomically) and the Dir of attributes to set,
//     with or without data; later PutMsgs carry data only. Closing the
//     stream commits; the reply is the resulting Dir. A stream that breaks
//     before it is closed commits nothing for a whole-file Put.
//     A whole-file Put may name an upload (an id the client chose): the
//     server then stages the data per user outside the tree, keeps it if
//     the stream breaks, and commits it when the stream closes. After a
//     break the client asks PutStatus(upload) how much arrived (or whether
//     the upload was committed, with its entry) and sends only the rest in
//     a new Put with the same upload and resume_at.
//   - Move, Remove, RemoveAll and Wstat are single requests.
//   - Find(FindReq{path, pred}) streams one FindReply per matching entry; an
//     entry that could not be read comes as a FindReply with dir (its path)
//     and err, and the walk goes on. FindGet also streams each regular
//     file's content right after its entry, in FindReplys with data only.
//   - Watch(PathReq) streams a WatchEvent for each change at or below the
//     path, starting with a lost event once the watch is in place; the open
//     stream is the client's lease on what it caches of that subtree.
//   - Space(PathReq) reports the room of the file system holding the tree
//     (statfs), so that df on a mount tells the truth.
//   - Lease(stream LeaseMsg) is a Watch that keeps close-to-open between
//     clients (internal/callback): the client names the path in its first
//     LeaseMsg; the server's first WatchEvent gives lease_ms. The client
//     renews every third of that (LeaseMsg.renew) and trusts its cache
//     until lease_ms after sending the last renewal granted
//     (WatchEvent.renewed). A change another client makes through the
//     server reaches it as a WatchEvent with brk set, before the writer's
//     call returns; the writer's call waits until the client's LeaseMsg
//     with that ack arrives, or the lease runs out (renewals are not
//     granted while a break waits). Calls carry the client's session in
//     the ferry-session header, so a writer is not sent its own changes.
//   - Chunks (internal/chunk: FastCDC, 2/8/64 KiB, BLAKE3) send only what
//     the other side lacks. Both sides must cut alike, so requests carry
//     chunk_version and a server of another scheme refuses with
//     KindInvalid (the client then falls back to Get and Put).
//   - ChunkList(ChunkListReq{path}) streams ChunkListReplys: the first holds
//     the file's Dir, each a ChunkRefs piece (up to MaxRefs hashes and
//     sizes) of its chunk list, in file order.
//   - ReadChunks is a bidirectional stream: the client sends ChunkReqs
//     (path in the first, the file it reads; hashes back to back) as it
//     decides what it lacks, without waiting; the server answers each hash
//     in order with a ChunkData holding the bytes, re-hashed from a file the
//     client may read, or missing. A read costs about two round trips plus
//     the missing bytes: the client starts requesting while the list still
//     arrives.
//   - PutChunked replaces a file atomically. The client sends a first
//     ChunkPutMsg with path, dir, size and the start of the chunk list, more
//     list pieces, and, interleaved, the bytes of chunks it knows the server
//     lacks (optimistic data, each after its ref); list_end ends both. As
//     each piece of the list arrives the server fills every chunk it can
//     from its index (re-hashed) or from bytes that arrived for the same
//     hash, and answers with need: the list indexes still missing and not
//     asked for before; the answer to list_end says need_end. The client
//     sends those chunks (each distinct hash once) while it still lists
//     the rest, so a large file's data flows while it is still being cut,
//     and closes after need_end. When
//     every chunk arrived and matched its hash, the server syncs the
//     temporary file, renames it over path and replies with the Dir. A
//     chunk whose bytes do not match its hash, or that was never listed,
//     fails the call with KindInvalid; a broken stream leaves the old file.
//     With optimistic data for all new chunks a write costs one round trip
//     plus the missing bytes; without, two.
//   - Fine deltas in PutChunked: if the first ChunkPutMsg says fine_ok and
//     the server holds a version of the file (a regular file it may read,
//     at most 64 MiB), the need replies say fine_ok too. The client may
//     then send a needed chunk as its fine list instead (hash and fine:
//     the hashes and sizes of its chunk.Fine pieces, about 1 KiB each);
//     the server takes the pieces it finds in that version (re-hashed),
//     answers fine_for and fine_need (the pieces it lacks), and the client
//     sends those (hash, data, piece). The chunk is checked against its
//     hash once whole. An edit then costs the pieces it touched rather than
//     whole 8 KiB chunks, for one round trip more; a client that never
//     says fine_ok, or a server that never answers it, keeps whole chunks.
//   - PutChunkedBatch runs many PutChunked puts on one bidirectional
//     stream (ferry sync sends a tree's files on one). Each ChunkPutMsg
//     names its put by a number (put, from 1, each number once; the
//     numbers of puts begun at once may arrive out of order) and each
//     ChunkPutReply answers one; a put runs exactly as a PutChunked call,
//     except that it ends with a reply carrying err instead of a status,
//     and the client abandons one with abort instead of cancelling a
//     call, and a committed entry comes without the path and name the put
//     named. Messages travel in ChunkPutBatch messages: a marshaled
//     ChunkPutMsgs or ChunkPutReplies of at most SendData bytes, sent when
//     full or once its first message has waited BatchWait, compressed
//     where both sides said so (zstd_ok) as the next part of one zstd
//     stream per direction (zwire.Encoder), so that even a batch of a few
//     replies builds on the names and attributes of those before. The
//     client's stream draws on 1 MiB of history unless the server allows
//     more (its first batch asks with wide; the server's replies say
//     window), and may begin a new zstd frame at any batch (its window
//     field set), to draw on more history or compress at another level;
//     the server's replies say how many bytes of the client's batches it
//     has received, from which the client chooses the level. Chunk
//     data inside is never compressed by itself: a file's pieces and many
//     files' lists share the stream, and no put pays a call's headers and
//     replies. A message for a put that ended is dropped; the
//     stream's end fails the puts still open. A server without the call
//     answers Unimplemented and the client makes each put a call.
//   - Commit applies a group of changes together (a cache's write-back):
//     CommitMsgs name the group (drawn at random by the client) and carry
//     its Changes in order (puts with their data, removes, moves, wstats;
//     a put's data larger than a message goes on in the changes after it,
//     more), end on the last. The server applies nothing before end has
//     arrived, then every change in order, as the single calls make them,
//     whatever becomes of the stream; a change that fails is reported by
//     its index (failed) and the others are made, and a removal of what
//     is not there counts as done. A file the client puts by chunks is
//     staged first by a PutChunked whose first message names a key
//     (stage): it runs as any chunked put, but is answered once assembled
//     and put in place only by the Commit whose change names the key
//     (staged); one not committed within 10 minutes is dropped. The
//     server keeps the outcome of its last 1024 groups, so a Commit sent
//     again after a lost answer gets the same answer. A server without
//     the call answers Unimplemented, and the client makes the changes
//     one call each, in order.
//   - A ChunkListReq may set inline_max: a file of at most that many bytes
//     then comes whole in the first ChunkListReply (inline, data), so a
//     client can ask for every file by chunks and still pay one round trip
//     for a small one.
//   - Compression (zstd, fastest level) is per message and negotiated per
//     call: a client that can decompress says so (GetReq.zstd, the first
//     ChunkReq's zstd, ChunkListReq.zstd) and the server then compresses
//     each payload that shrinks, flagging it (Data.zstd, ChunkData.zstd,
//     ChunkListReply.zstd); a server that accepts compressed uploads says so
//     in its replies (DirReply.zstd, ChunkListReply.zstd_ok,
//     ChunkPutReply.zstd_ok) and the client compresses from then on, on
//     that connection (PutMsg.zstd, ChunkPutMsg.zstd). Peers without zstd
//     never set the flags and so get and send plain bytes. Hashes are
//     always of the uncompressed bytes.
//
// An upload (Put, PutChunked, Commit) may declare its file's size in the metadata
// key SizeKey, so that the server reserves no more of its memory budget
// for the stream than the file needs. A server whose budget is taken
// refuses an upload stream at once with codes.ResourceExhausted and no
// Error detail; FromStatus makes that an error that is ErrBusy, which the
// client waits out and tries again.
//
// A call that fails returns a gRPC status whose code follows the error's
// kind and whose single detail is an Error message with the ferry.Kind
// number, op, path and message; FromStatus rebuilds the *ferry.Error.
// Dir carries only stored attributes; decorations never cross the wire.
package proto

// MaxData is the most data one Data, PutMsg or FindReply carries. It is far
// below gRPC's 4 MiB message limit and large enough that per-message costs
// vanish.
const MaxData = 256 << 10

// SendData is the most data a sender puts in one message: MaxData less
// room for the message's other fields, so that the encoded message fits a
// 256 KiB buffer of gRPC's pool (transport.BufferPool) instead of taking
// the next size, 1 MiB. A message queued for a slow receiver pins its
// buffer until the socket takes it; with 1 MiB buffers that was about
// 2 MiB per slow download. Receivers still take MaxData.
const SendData = MaxData - 64

// SizeKey is the metadata key of an upload's declared size in bytes.
const SizeKey = "ferry-size"

// MaxRefs is the most chunk refs one ChunkRefs carries (about 36 KB), and
// the most hashes one ChunkReq asks for.
const MaxRefs = 1024

// NoChunksOp is the op of the KindInvalid error with which a server refuses
// the chunk calls when it does not serve chunks or cuts them differently:
// a client that gets it falls back to Get and Put and stops asking. Other
// KindInvalid errors of the chunk calls are about the request, not the
// server.
const NoChunksOp = "server.chunks"

// SessionHeader carries a client's session in every call, so that the
// changes it makes break only the other clients' leases (Lease).
const SessionHeader = "ferry-session"
