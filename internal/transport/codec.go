package transport

import (
	"fmt"

	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
)

// Codec is gRPC's protobuf codec with its buffers from BufferPool instead
// of gRPC's process-wide pool, whose tiers jump from 32 KiB to 1 MiB: a
// file message of just under 256 KiB then pins a 1 MiB buffer while it
// waits for a slow receiver's socket, about 2 MiB per slow download. Both
// ends pass it explicitly (grpc.ForceServerCodecV2, grpc.ForceCodecV2);
// the bytes on the wire are protobuf's, so peers with gRPC's own codec
// understand it.
var Codec encoding.CodecV2 = codec{}

type codec struct{}

func (codec) Name() string { return "proto" }

// Marshal encodes v into one buffer of BufferPool, or of its own when
// small enough that pooling does not pay.
func (codec) Marshal(v any) (mem.BufferSlice, error) {
	m, ok := v.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("transport.Codec: cannot marshal %T, not a proto.Message", v)
	}
	// The size, computed once, lets MarshalAppend reuse it.
	size := proto.Size(m)
	opts := proto.MarshalOptions{UseCachedSize: true}
	if mem.IsBelowBufferPoolingThreshold(size) {
		b, err := opts.Marshal(m)
		if err != nil {
			return nil, err
		}
		return mem.BufferSlice{mem.SliceBuffer(b)}, nil
	}
	buf := BufferPool.Get(size)
	if _, err := opts.MarshalAppend((*buf)[:0], m); err != nil {
		BufferPool.Put(buf)
		return nil, err
	}
	return mem.BufferSlice{mem.NewBuffer(buf, BufferPool)}, nil
}

// Unmarshal decodes data into v; v keeps no reference to data.
func (codec) Unmarshal(data mem.BufferSlice, v any) error {
	m, ok := v.(proto.Message)
	if !ok {
		return fmt.Errorf("transport.Codec: cannot unmarshal into %T, not a proto.Message", v)
	}
	buf := data.MaterializeToBuffer(BufferPool)
	defer buf.Free()
	return proto.Unmarshal(buf.ReadOnlyData(), m)
}
