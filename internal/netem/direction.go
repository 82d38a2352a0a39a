package netem

import (
	"errors"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// lineSize is the capacity of a direction's delay line in packets: 65536
// full-size packets are 98 MB in flight, a gigabit per second for 800 ms.
// A packet that finds the line full counts as dropped by the queue.
const lineSize = 1 << 16

// packet is a packet in the delay line with its delivery time.
type packet struct {
	buf *[]byte
	n   int
	at  time.Duration
}

// bufSize is the size of pooled packet buffers: a 1500-byte MTU packet and
// some room. Larger packets (if someone raises the MTU) get their own.
const bufSize = 2048

var bufPool = sync.Pool{New: func() any { b := make([]byte, bufSize); return &b }}

// direction forwards the packets read from in to out through a shaper. Its
// reader goroutine owns the shaper; its writer goroutine sleeps until each
// packet's delivery time and writes it.
type direction struct {
	in, out *os.File
	params  atomic.Pointer[params]
	line    chan packet

	packets, bytes           atomic.Int64
	lossPackets, lossBytes   atomic.Int64
	queuePackets, queueBytes atomic.Int64
}

func newDirection(in, out *os.File) *direction {
	return &direction{in: in, out: out, line: make(chan packet, lineSize)}
}

func (d *direction) stats() Stats {
	return Stats{
		d.packets.Load(), d.bytes.Load(),
		d.lossPackets.Load(), d.lossBytes.Load(),
		d.queuePackets.Load(), d.queueBytes.Load(),
	}
}

func (d *direction) read(r *runner) {
	sh := newShaper()
	r.readPackets(d.in, func(pkt []byte) { d.offer(r, sh, pkt) })
}

// readPackets hands each packet read from f to handle until the runner
// stops or f is closed; handle must not keep the slice.
func (r *runner) readPackets(f *os.File, handle func(pkt []byte)) {
	defer r.wg.Done()
	buf := make([]byte, 65536)
	for {
		n, err := f.Read(buf)
		if err != nil {
			if errors.Is(err, os.ErrClosed) {
				return
			}
			select {
			case <-r.done:
				return
			default:
			}
			// A TUN read fails only transiently (the device going down);
			// do not spin.
			time.Sleep(time.Millisecond)
			continue
		}
		handle(buf[:n])
	}
}

// offer passes one packet through the direction's model: lost, dropped by
// the full queue, or put on the delay line for its writer. sh is the
// direction's shaper, owned by the one goroutine that offers packets.
func (d *direction) offer(r *runner, sh *shaper, pkt []byte) {
	n := len(pkt)
	at, v := sh.admit(r.now(), n, d.params.Load())
	switch v {
	case dropLoss:
		d.lossPackets.Add(1)
		d.lossBytes.Add(int64(n))
		return
	case dropQueue:
		d.queuePackets.Add(1)
		d.queueBytes.Add(int64(n))
		return
	}
	var p *[]byte
	if n <= bufSize {
		p = bufPool.Get().(*[]byte)
	} else {
		s := make([]byte, n)
		p = &s
	}
	copy(*p, pkt)
	select {
	case d.line <- packet{p, n, at}:
	default:
		d.queuePackets.Add(1)
		d.queueBytes.Add(int64(n))
		putBuf(p)
	}
}

func putBuf(p *[]byte) {
	if cap(*p) == bufSize {
		bufPool.Put(p)
	}
}

// Waits shorter than coarse are slept with nanosleep on the writer's thread,
// which is accurate to tens of microseconds; longer ones use a runtime timer,
// which may fire about a millisecond late, for all but the last coarse
// stretch. Waits shorter than fine are not worth a system call.
const (
	coarse = 2 * time.Millisecond
	fine   = 20 * time.Microsecond
)

func (d *direction) write(r *runner) {
	defer r.wg.Done()
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	for {
		var p packet
		select {
		case p = <-d.line:
		case <-r.done:
			return
		}
		for {
			wait := p.at - r.now()
			if wait <= fine {
				break
			}
			if wait > coarse {
				timer.Reset(wait - coarse + time.Millisecond/2)
				select {
				case <-timer.C:
				case <-r.done:
					return
				}
				continue
			}
			ts := unix.NsecToTimespec(int64(wait))
			unix.Nanosleep(&ts, nil)
		}
		if _, err := d.out.Write((*p.buf)[:p.n]); err == nil {
			d.packets.Add(1)
			d.bytes.Add(int64(p.n))
		} else if errors.Is(err, os.ErrClosed) {
			return
		} else {
			// The far side refused it (device down): the wire lost it.
			d.queuePackets.Add(1)
			d.queueBytes.Add(int64(p.n))
		}
		putBuf(p.buf)
	}
}
