package netem

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"sync"
	"time"
)

// Mesh is several sites, each a network namespace, every ordered pair of
// them joined by a link of its own, for a replica set spread over sites
// (and, with a link's Loss at 1, cut between them). Site i's namespace has
// address Sites[i].Addr on its TUN device; packets to another site's
// address go through the link from i to that site. The model of each link
// is Bed's (see the package comment); one goroutine per site reads its
// device and shapes what it sends, one per link delivers.
type Mesh struct {
	Sites []Site

	files  []*os.File            // each site's TUN device
	links  map[[2]int]*direction // [from, to]
	owned  map[[2]int]*shaper    // each link's shaper, used by its sender's reader
	prefix [3]byte               // the sites' /24
	runner

	closeOnce sync.Once
	closeErr  error
}

// Site is one namespace of a mesh.
type Site struct {
	NS   string
	Addr netip.Addr
}

// NewMesh makes n sites, the link from i to j set by link(i, j), and
// starts forwarding. ctx bounds the setup only; the mesh runs until Close.
// On error nothing is left behind.
func NewMesh(ctx context.Context, n int, link func(from, to int) Link) (*Mesh, error) {
	if err := Available(); err != nil {
		return nil, err
	}
	if n < 2 || n > 250 {
		return nil, fmt.Errorf("netem: a mesh of %d sites", n)
	}
	sweepOnce.Do(func() { Sweep(ctx) })
	k := counter.Add(1) - 1
	pid := os.Getpid()
	m := &Mesh{links: map[[2]int]*direction{}, owned: map[[2]int]*shaper{}, runner: newRunner(),
		prefix: [3]byte{10, 78, byte((int64(pid)*7 + k) % 256)}}
	for i := range n {
		m.Sites = append(m.Sites, Site{
			NS:   fmt.Sprintf("ferry-%d-%d-site%d", pid, k, i),
			Addr: netip.AddrFrom4([4]byte{m.prefix[0], m.prefix[1], m.prefix[2], byte(i + 1)}),
		})
	}
	if err := m.setup(ctx); err != nil {
		return nil, errors.Join(err, m.remove())
	}
	for i := range n {
		for j := range n {
			if i != j {
				d := newDirection(nil, m.files[j])
				m.links[[2]int{i, j}] = d
				m.owned[[2]int{i, j}] = newShaper()
				m.SetLink(i, j, link(i, j))
				m.wg.Add(1)
				go d.write(&m.runner)
			}
		}
	}
	for i := range n {
		m.wg.Add(1)
		go m.read(i)
	}
	return m, nil
}

func (m *Mesh) setup(ctx context.Context) error {
	for _, s := range m.Sites {
		f, _, err := makeNS(ctx, s.NS, s.Addr.String()+"/24")
		if err != nil {
			return err
		}
		m.files = append(m.files, f)
	}
	return nil
}

// read takes site i's outgoing packets and offers each to the link to the
// site it is addressed to; a packet for no site is dropped.
func (m *Mesh) read(i int) {
	m.readPackets(m.files[i], func(pkt []byte) {
		if len(pkt) < 20 || pkt[0]>>4 != 4 || [3]byte(pkt[16:19]) != m.prefix {
			return // not IPv4 to a site
		}
		key := [2]int{i, int(pkt[19]) - 1}
		if d := m.links[key]; d != nil {
			d.offer(&m.runner, m.owned[key], pkt)
		}
	})
}

// SetLink changes the link from site i to site j. It takes effect from the
// next packet. A Loss of 1 cuts it.
func (m *Mesh) SetLink(i, j int, l Link) {
	d := m.links[[2]int{i, j}]
	if d == nil {
		return
	}
	back := m.links[[2]int{j, i}]
	cfg := Config{Up: l}
	if back != nil && back.params.Load() != nil {
		cfg.Down = back.params.Load().Link // the queue's default follows the round trip
	}
	p, _ := resolve(cfg)
	d.params.Store(&p)
}

// Stats returns the counters of the link from site i to site j.
func (m *Mesh) Stats(i, j int) Stats {
	if d := m.links[[2]int{i, j}]; d != nil {
		return d.stats()
	}
	return Stats{}
}

// Listen announces on an address in site i's namespace.
func (m *Mesh) Listen(i int, network, address string) (net.Listener, error) {
	return listenIn(m.Sites[i].NS, network, address)
}

// Dial connects from site i's namespace to address (a literal IP and port).
func (m *Mesh) Dial(ctx context.Context, i int, network, address string) (net.Conn, error) {
	return dialIn(ctx, m.Sites[i].NS, network, address)
}

// Close stops forwarding, kills what still runs in the sites and removes
// their namespaces. It is idempotent.
func (m *Mesh) Close() error {
	m.closeOnce.Do(func() {
		close(m.done)
		var errs []error
		for _, f := range m.files {
			errs = append(errs, f.Close())
		}
		m.wg.Wait()
		errs = append(errs, m.remove())
		m.closeErr = errors.Join(errs...)
	})
	return m.closeErr
}

// remove removes every site's namespace, best effort.
func (m *Mesh) remove() error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var errs []error
	for _, s := range m.Sites {
		if _, err := os.Stat(NSPath(s.NS)); err == nil {
			errs = append(errs, removeNS(ctx, s.NS))
		}
	}
	return errors.Join(errs...)
}
