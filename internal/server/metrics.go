package server

import (
	"net"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferryfs/ferry"
	"github.com/ferryfs/ferry/internal/transport"
)

// Collector returns a Prometheus collector of the server's counters and of
// each connection's kernel measurements, read when scraped.
func (s *Server) Collector() prometheus.Collector { return collector{s} }

type collector struct{ s *Server }

var (
	// connLabels: addr is empty but with Config.MetricsPerConn.
	connLabels      = []string{"host", "user", "addr"}
	descCalls       = prometheus.NewDesc("ferry_calls_total", "Calls answered, by operation.", []string{"op"}, nil)
	descErrors      = prometheus.NewDesc("ferry_errors_total", "Calls that failed.", nil, nil)
	descBytes       = prometheus.NewDesc("ferry_payload_bytes_total", "Payload bytes of all calls, by direction.", []string{"dir"}, nil)
	descRAHeld      = prometheus.NewDesc("ferry_readahead_bytes", "Bytes read ahead of all connections.", nil, nil)
	descRACanc      = prometheus.NewDesc("ferry_readahead_cancelled_total", "Read-aheads stopped by a cancelled stream or a broken connection.", nil, nil)
	descRAStreams   = prometheus.NewDesc("ferry_readahead_streams", "Streams reading ahead.", nil, nil)
	descRAOrphan    = prometheus.NewDesc("ferry_readahead_orphaned_bytes", "Bytes still held by the read-ahead of cancelled streams and broken connections, not yet freed.", nil, nil)
	descConnRAT     = prometheus.NewDesc("ferry_conn_readahead_target_bytes", "The sum of the target read-ahead depths of the streams of a host's connections for a user.", connLabels, nil)
	descConnRA      = prometheus.NewDesc("ferry_conn_readahead_bytes", "Bytes read ahead for a host's connections for a user.", connLabels, nil)
	descConnRTT     = prometheus.NewDesc("ferry_conn_rtt_seconds", "Smoothed round trip of the slowest of a host's connections for a user.", connLabels, nil)
	descConnBW      = prometheus.NewDesc("ferry_conn_delivery_rate_bytes", "Recent delivery rate of a host's connections for a user, bytes per second.", connLabels, nil)
	descConnTx      = prometheus.NewDesc("ferry_conn_sent_bytes_total", "Bytes a host's connections for a user sent, retransmissions included.", connLabels, nil)
	descConnRx      = prometheus.NewDesc("ferry_conn_received_bytes_total", "Bytes a host's connections for a user received.", connLabels, nil)
	descConnRe      = prometheus.NewDesc("ferry_conn_retransmits_total", "Segments a host's connections for a user retransmitted.", connLabels, nil)
	descConnCC      = prometheus.NewDesc("ferry_conn_info", "The congestion controllers of a host's connections for a user, as a label.", append(connLabels, "congestion"), nil)
	descZstd        = prometheus.NewDesc("ferry_zstd_bytes_total", "Payload bytes that zstd shrank, before and after compression.", []string{"stage"}, nil)
	descZSkip       = prometheus.NewDesc("ferry_zstd_skipped_total", "Payloads sent uncompressed because they did not shrink.", nil, nil)
	descIxSize      = prometheus.NewDesc("ferry_chunk_index_chunks", "Chunk entries in the chunk index.", nil, nil)
	descIxMax       = prometheus.NewDesc("ferry_chunk_index_max_chunks", "The chunk index's bound, in chunk entries.", nil, nil)
	descIxFiles     = prometheus.NewDesc("ferry_chunk_index_files", "Files in the chunk index.", nil, nil)
	descTrashFiles  = prometheus.NewDesc("ferry_trash_files", "Replaced and removed files kept for their chunks.", nil, nil)
	descTrashBytes  = prometheus.NewDesc("ferry_trash_bytes", "Bytes of the files kept in the trash.", nil, nil)
	descIxDone      = prometheus.NewDesc("ferry_chunk_index_indexed_total", "Files chunked and indexed.", nil, nil)
	descLeases      = prometheus.NewDesc("ferry_leases", "Clients' leases held (watches that break).", nil, nil)
	descBreaks      = prometheus.NewDesc("ferry_breaks_total", "Callback breaks sent to clients.", nil, nil)
	descWriteLeases = prometheus.NewDesc("ferry_write_leases", "Write leases clients hold over subtrees.", nil, nil)
	descRecalls     = prometheus.NewDesc("ferry_recalls_total", "Write leases recalled for another client's call.", nil, nil)
	descBreakWaits  = prometheus.NewDesc("ferry_break_waits_total", "Changes answered only after other clients acknowledged breaks.", nil, nil)
	descBreakTime   = prometheus.NewDesc("ferry_break_wait_seconds_total", "Time changes waited for other clients' acknowledgements.", nil, nil)
	descUpMem       = prometheus.NewDesc("ferry_upload_memory_bytes", "Memory reserved by upload streams in progress, by what they may send ahead of their handlers.", nil, nil)
	descUpMax       = prometheus.NewDesc("ferry_upload_memory_max_bytes", "The most memory upload streams may reserve (serve --memory less the read-ahead budget).", nil, nil)
	descUpRefused   = prometheus.NewDesc("ferry_upload_refused_total", "Upload streams refused because the upload memory was taken; their clients try again.", nil, nil)
	descReceived    = prometheus.NewDesc("ferry_received_held_bytes", "Bytes received and held in gRPC's buffers, not yet read by a handler.", nil, nil)
	descIxLook      = prometheus.NewDesc("ferry_chunk_index_lookups_total", "Chunk reads through the index, by result (hit, miss, stale).", []string{"result"}, nil)
)

func (c collector) Describe(ch chan<- *prometheus.Desc) {
	c.s.latency.Describe(ch)
	for _, d := range []*prometheus.Desc{descCalls, descErrors, descBytes, descRAHeld, descRACanc, descRAStreams, descRAOrphan,
		descConnRA, descConnRAT, descConnRTT, descConnBW, descConnTx, descConnRx, descConnRe, descConnCC,
		descZstd, descZSkip, descIxSize, descIxMax, descIxFiles, descIxDone, descIxLook, descTrashFiles, descTrashBytes, descLeases, descBreaks, descWriteLeases, descRecalls, descBreakWaits, descBreakTime,
		descUpMem, descUpMax, descUpRefused, descReceived} {
		ch <- d
	}
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	s := c.s
	s.latency.Collect(ch)
	for i, n := range opNames {
		ch <- prometheus.MustNewConstMetric(descCalls, prometheus.CounterValue, float64(s.calls[i].Load()), n)
	}
	ch <- prometheus.MustNewConstMetric(descErrors, prometheus.CounterValue, float64(s.errs.Load()))
	ch <- prometheus.MustNewConstMetric(descBytes, prometheus.CounterValue, float64(s.bytesIn.Load()), "in")
	ch <- prometheus.MustNewConstMetric(descBytes, prometheus.CounterValue, float64(s.bytesOut.Load()), "out")
	ra := s.budget.stats()
	ch <- prometheus.MustNewConstMetric(descRAHeld, prometheus.GaugeValue, float64(ra.used))
	ch <- prometheus.MustNewConstMetric(descRACanc, prometheus.CounterValue, float64(s.cancelledReads.Load()))
	ch <- prometheus.MustNewConstMetric(descRAStreams, prometheus.GaugeValue, float64(ra.streams))
	ch <- prometheus.MustNewConstMetric(descRAOrphan, prometheus.GaugeValue, float64(ra.orphaned))
	reserved, total, refused := s.Uploads()
	ch <- prometheus.MustNewConstMetric(descUpMem, prometheus.GaugeValue, float64(reserved))
	ch <- prometheus.MustNewConstMetric(descUpMax, prometheus.GaugeValue, float64(total))
	ch <- prometheus.MustNewConstMetric(descUpRefused, prometheus.CounterValue, float64(refused))
	ch <- prometheus.MustNewConstMetric(descReceived, prometheus.GaugeValue, float64(s.Received()))
	waits, waitTime := s.leases.Waits()
	ch <- prometheus.MustNewConstMetric(descLeases, prometheus.GaugeValue, float64(s.leases.Holders()))
	ch <- prometheus.MustNewConstMetric(descBreaks, prometheus.CounterValue, float64(s.leases.Breaks()))
	ch <- prometheus.MustNewConstMetric(descWriteLeases, prometheus.GaugeValue, float64(s.leases.WriteLeases()))
	ch <- prometheus.MustNewConstMetric(descRecalls, prometheus.CounterValue, float64(s.leases.Recalls()))
	ch <- prometheus.MustNewConstMetric(descBreakWaits, prometheus.CounterValue, float64(waits))
	ch <- prometheus.MustNewConstMetric(descBreakTime, prometheus.CounterValue, waitTime.Seconds())
	z := s.zip.Stats()
	ch <- prometheus.MustNewConstMetric(descZstd, prometheus.CounterValue, float64(z.In), "in")
	ch <- prometheus.MustNewConstMetric(descZstd, prometheus.CounterValue, float64(z.Out), "out")
	ch <- prometheus.MustNewConstMetric(descZSkip, prometheus.CounterValue, float64(z.Skipped))
	if x, ok := ferry.As[Indexer](s.fs); ok {
		st := x.Index().Stats()
		ch <- prometheus.MustNewConstMetric(descIxSize, prometheus.GaugeValue, float64(st.Chunks))
		ch <- prometheus.MustNewConstMetric(descIxMax, prometheus.GaugeValue, float64(st.MaxChunks))
		ch <- prometheus.MustNewConstMetric(descIxFiles, prometheus.GaugeValue, float64(st.Files))
		ch <- prometheus.MustNewConstMetric(descIxDone, prometheus.CounterValue, float64(st.Indexed))
		ch <- prometheus.MustNewConstMetric(descIxLook, prometheus.CounterValue, float64(st.Hits), "hit")
		ch <- prometheus.MustNewConstMetric(descIxLook, prometheus.CounterValue, float64(st.Misses), "miss")
		ch <- prometheus.MustNewConstMetric(descIxLook, prometheus.CounterValue, float64(st.Stale), "stale")
		if t, ok := ferry.As[Trasher](s.fs); ok {
			ts := t.Trash()
			ch <- prometheus.MustNewConstMetric(descTrashFiles, prometheus.GaugeValue, float64(ts.Files))
			ch <- prometheus.MustNewConstMetric(descTrashBytes, prometheus.GaugeValue, float64(ts.Bytes))
		}
	}
	// Connection series are by client host and user, not by connection
	// (whose port is new each time): the series do not grow with the
	// connections a server has seen. Counters add what ended connections
	// had sent, as last seen, so they never go back.
	type group struct {
		ra, rat, bw float64
		rtt         float64 // The slowest connection's.
		tx, rx, re  float64
		congestion  map[string]bool
	}
	groups := map[hostUser]*group{}
	get := func(k hostUser) *group {
		g := groups[k]
		if g == nil {
			g = &group{congestion: map[string]bool{}}
			groups[k] = g
		}
		return g
	}
	// The live connections and the ended ones are summed under one hold
	// of s.mu, so that a connection ending meanwhile (HandleConn) counts
	// in one of them, with the totals this scrape saw, and never in
	// both or neither.
	s.mu.Lock()
	for cn := range s.conns {
		cn.mu.Lock()
		k := hostUser{host: hostOf(cn.addr), user: cn.user}
		if s.cfg.MetricsPerConn {
			k.addr = cn.addr
		}
		cn.mu.Unlock()
		g := get(k)
		g.ra += float64(cn.readAhead.Load())
		g.rat += float64(cn.readAheadTarget.Load())
		if cn.raw == nil {
			continue
		}
		info, err := transport.ConnInfo(cn.raw)
		if err != nil {
			continue
		}
		cn.mu.Lock()
		cn.seen = connTotals{tx: float64(info.BytesSent), rx: float64(info.BytesRecv), re: float64(info.Retrans)}
		cn.mu.Unlock()
		g.rtt = max(g.rtt, info.RTT.Seconds())
		g.bw += float64(info.DeliveryRate)
		g.tx += float64(info.BytesSent)
		g.rx += float64(info.BytesRecv)
		g.re += float64(info.Retrans)
		g.congestion[info.Congestion] = true
	}
	for k, t := range s.ended {
		g := get(k)
		g.tx, g.rx, g.re = g.tx+t.tx, g.rx+t.rx, g.re+t.re
	}
	s.mu.Unlock()
	for k, g := range groups {
		labels := []string{k.host, k.user, k.addr}
		ch <- prometheus.MustNewConstMetric(descConnRA, prometheus.GaugeValue, g.ra, labels...)
		ch <- prometheus.MustNewConstMetric(descConnRAT, prometheus.GaugeValue, g.rat, labels...)
		ch <- prometheus.MustNewConstMetric(descConnRTT, prometheus.GaugeValue, g.rtt, labels...)
		ch <- prometheus.MustNewConstMetric(descConnBW, prometheus.GaugeValue, g.bw, labels...)
		ch <- prometheus.MustNewConstMetric(descConnTx, prometheus.CounterValue, g.tx, labels...)
		ch <- prometheus.MustNewConstMetric(descConnRx, prometheus.CounterValue, g.rx, labels...)
		ch <- prometheus.MustNewConstMetric(descConnRe, prometheus.CounterValue, g.re, labels...)
		for cc := range g.congestion {
			ch <- prometheus.MustNewConstMetric(descConnCC, prometheus.GaugeValue, 1, append(labels, cc)...)
		}
	}
}

// hostUser keys the connection series: a client host and a user (and the
// connection's address with Config.MetricsPerConn).
type hostUser struct{ host, user, addr string }

// connTotals are a connection's counters as a scrape last saw them.
type connTotals struct{ tx, rx, re float64 }

// hostOf is addr without its port.
func hostOf(addr string) string {
	if h, _, err := net.SplitHostPort(addr); err == nil {
		return h
	}
	return addr
}
