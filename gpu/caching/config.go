package caching

import (
	"fmt"
	"math/bits"
	"strconv"
	"strings"

	"vramscope/gpu"
)

// Config is the allocator's settings, as PYTORCH_CUDA_ALLOC_CONF sets them,
// plus the memory fraction set_per_process_memory_fraction sets.
type Config struct {
	gpu.Rules
	// GarbageCollectionThreshold in (0,1) turns GC on when a memory fraction is set.
	GarbageCollectionThreshold float64
	// MemoryFraction in (0,1] caps reserved memory at that share of the device; 0: unset.
	MemoryFraction float64
	// Limit, when not 0, caps reserved memory at that many bytes, over
	// MemoryFraction: the limit set_per_process_memory_fraction set with
	// a call, which the settings do not record.
	Limit                   uint64
	ReleaseLockOnCudaMalloc bool
	// Raw is the string the config was parsed from.
	Raw string
}

// DefaultConfig is PyTorch's default configuration.
func DefaultConfig() Config { return Config{Rules: gpu.DefaultRules()} }

// ConfigError is a bad PYTORCH_CUDA_ALLOC_CONF; its text is PyTorch's.
type ConfigError struct{ Msg string }

func (e *ConfigError) Error() string { return e.Msg }

func cfgErr(format string, args ...any) error { return &ConfigError{fmt.Sprintf(format, args...)} }

// lex splits a config string the way PyTorch's lexArgs does: ',', ':', '['
// and ']' are tokens of their own, spaces are dropped.
func lex(s string) []string {
	var toks []string
	var buf strings.Builder
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case ',', ':', '[', ']':
			if buf.Len() > 0 {
				toks = append(toks, buf.String())
				buf.Reset()
			}
			toks = append(toks, string(c))
		case ' ':
		default:
			buf.WriteByte(c)
		}
	}
	if buf.Len() > 0 {
		toks = append(toks, buf.String())
	}
	return toks
}

// ParseConfig parses a PYTORCH_CUDA_ALLOC_CONF-style string such as
// "expandable_segments:True,max_split_size_mb:128". Errors carry PyTorch's
// messages (CachingAllocatorConfig::parseArgs).
func ParseConfig(s string) (Config, error) {
	c := DefaultConfig()
	c.Raw = s
	p := &parser{toks: lex(s)}
	for p.i = 0; p.i < len(p.toks); p.i++ {
		key := p.toks[p.i]
		var err error
		switch key {
		case "max_split_size_mb":
			var mb uint64
			if mb, err = p.sizeMB(key); err == nil {
				c.MaxSplitSize = mb << 20
			}
		case "max_non_split_rounding_mb":
			var mb uint64
			if mb, err = p.sizeMB(key); err == nil {
				c.MaxNonSplitRounding = mb << 20
			}
		case "garbage_collection_threshold":
			c.GarbageCollectionThreshold, err = p.gcThreshold()
		case "per_process_memory_fraction":
			c.MemoryFraction, err = p.fraction()
		case "roundup_power2_divisions":
			err = p.roundup(&c.RoundupDivisions)
		case "expandable_segments":
			c.Expandable, err = p.boolean(key)
		case "release_lock_on_cudamalloc":
			c.ReleaseLockOnCudaMalloc, err = p.boolean(key)
		case "pinned_use_cuda_host_register", "pinned_use_background_threads", "graph_capture_record_stream_reuse":
			_, err = p.boolean(key) // host-side or graph options: no effect on device memory layout
		case "pinned_num_register_threads", "pinned_reserve_segment_size_mb":
			_, err = p.value(key)
		case "backend":
			var v string
			if v, err = p.value(key); err == nil && v != "native" {
				if v == "cudaMallocAsync" {
					err = cfgErr("backend:cudaMallocAsync is the driver's own allocator; vramscope models only the native caching allocator")
				} else {
					err = cfgErr("Unknown allocator backend, options are native and cudaMallocAsync")
				}
			}
		default:
			err = cfgErr("Unrecognized CachingAllocator option: %s", key)
		}
		if err != nil {
			return Config{}, err
		}
		if p.i+1 < len(p.toks) {
			if err := p.expect(","); err != nil {
				return Config{}, err
			}
		}
	}
	return c, nil
}

type parser struct {
	toks []string
	i    int
}

func (p *parser) expect(tok string) error {
	p.i++
	if p.i >= len(p.toks) || p.toks[p.i] != tok {
		return cfgErr("Error parsing CachingAllocator settings, expected %s", tok)
	}
	return nil
}

// value consumes ":" and the value after it.
func (p *parser) value(key string) (string, error) {
	if err := p.expect(":"); err != nil {
		return "", err
	}
	p.i++
	if p.i >= len(p.toks) {
		return "", cfgErr("Error, expecting %s value", key)
	}
	return p.toks[p.i], nil
}

func (p *parser) sizeMB(key string) (uint64, error) {
	v, err := p.value(key)
	if err != nil {
		return 0, err
	}
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		return 0, cfgErr("CachingAllocator option %s must be a whole number of MB, got %q", key, v)
	}
	if n <= gpu.LargeBuffer>>20 {
		return 0, cfgErr("CachingAllocator option %s too small, must be > %d", key, gpu.LargeBuffer>>20)
	}
	return min(n, ^uint64(0)>>20), nil
}

func (p *parser) gcThreshold() (float64, error) {
	v, err := p.value("garbage_collection_threshold")
	if err != nil {
		return 0, err
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil {
		return 0, cfgErr("garbage_collection_threshold must be a number, got %q", v)
	}
	if f <= 0 {
		return 0, cfgErr("garbage_collect_threshold too small, set it 0.0~1.0")
	}
	if f >= 1 {
		return 0, cfgErr("garbage_collect_threshold too big, set it 0.0~1.0")
	}
	return f, nil
}

func (p *parser) fraction() (float64, error) {
	v, err := p.value("per_process_memory_fraction")
	if err != nil {
		return 0, err
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || f <= 0 || f > 1 {
		return 0, cfgErr("invalid fraction:%s. Please set within (0, 1].", v)
	}
	return f, nil
}

func (p *parser) boolean(key string) (bool, error) {
	if err := p.expect(":"); err != nil {
		return false, err
	}
	p.i++
	if p.i >= len(p.toks) || (p.toks[p.i] != "True" && p.toks[p.i] != "False") {
		return false, cfgErr("Expected a single True/False argument for %s", key)
	}
	return p.toks[p.i] == "True", nil
}

func isPow2(n uint64) bool { return n != 0 && n&(n-1) == 0 }

// roundup parses roundup_power2_divisions: one power of two for every
// interval, or a list [MB:divisions,...,>:divisions]. The ">" entry fills the
// intervals after the last listed one (today's PyTorch; see spec §2.2).
func (p *parser) roundup(table *[gpu.RoundupIntervals]uint64) error {
	if err := p.expect(":"); err != nil {
		return err
	}
	p.i++
	if p.i >= len(p.toks) {
		return cfgErr("Error, expecting roundup_power2_divisions value")
	}
	if p.toks[p.i] != "[" {
		n, err := strconv.ParseUint(p.toks[p.i], 10, 64)
		if err != nil || !isPow2(n) {
			return cfgErr("For roundups, the divisons has to be power of 2 ")
		}
		for i := range table {
			table[i] = n
		}
		return nil
	}
	last, seen := 0, false
	for p.i++; p.i < len(p.toks) && p.toks[p.i] != "]"; p.i++ {
		interval := p.toks[p.i]
		if err := p.expect(":"); err != nil {
			return err
		}
		p.i++
		if p.i >= len(p.toks) {
			return cfgErr("Error parsing roundup_power2_divisions value")
		}
		div, err := strconv.ParseUint(p.toks[p.i], 10, 64)
		if err != nil || (div != 0 && !isPow2(div)) {
			return cfgErr("For roundups, the divisons has to be power of 2 or 0 to disable roundup ")
		}
		if interval == ">" {
			start := last + 1
			if !seen {
				start = 0
			}
			for i := start; i < len(table); i++ {
				table[i] = div
			}
		} else {
			mb, err := strconv.ParseUint(interval, 10, 64)
			if err != nil || !isPow2(mb) {
				return cfgErr("For roundups, the intervals have to be power of 2 ")
			}
			idx := min(bits.TrailingZeros64(mb), len(table)-1)
			if !seen {
				for i := 0; i < idx; i++ {
					table[i] = div
				}
			}
			table[idx] = div
			last, seen = idx, true
		}
		if p.i+1 < len(p.toks) && p.toks[p.i+1] != "]" {
			if err := p.expect(","); err != nil {
				return err
			}
		}
	}
	if p.i >= len(p.toks) {
		return cfgErr("Error parsing CachingAllocator settings, expected ]")
	}
	return nil
}

// String renders the settings that differ from the defaults in
// PYTORCH_CUDA_ALLOC_CONF syntax.
func (c Config) String() string {
	var parts []string
	for _, kv := range c.Settings() {
		if kv.Value != "" {
			parts = append(parts, kv.Key+":"+kv.Value)
		}
	}
	return strings.Join(parts, ",")
}

// KeyValue is one PYTORCH_CUDA_ALLOC_CONF setting as written; Value is
// "" where the setting is at PyTorch's default.
type KeyValue struct{ Key, Value string }

// Settings lists every setting PYTORCH_CUDA_ALLOC_CONF sets, in the order
// String writes them, each as written or "" at its default.
func (c Config) Settings() []KeyValue {
	kv := func(key string, set bool, value string) KeyValue {
		if !set {
			value = ""
		}
		return KeyValue{key, value}
	}
	uniform := true
	for _, d := range c.RoundupDivisions {
		uniform = uniform && d == c.RoundupDivisions[0]
	}
	roundup := fmt.Sprint(c.RoundupDivisions[0])
	if !uniform {
		var items []string
		for i, d := range c.RoundupDivisions {
			items = append(items, fmt.Sprintf("%d:%d", uint64(1)<<i, d))
		}
		roundup = "[" + strings.Join(items, ",") + "]"
	}
	return []KeyValue{
		kv("expandable_segments", c.Expandable, "True"),
		kv("max_split_size_mb", c.MaxSplitSize != 0 && c.MaxSplitSize != gpu.Unlimited, fmt.Sprint(c.MaxSplitSize>>20)),
		kv("max_non_split_rounding_mb", c.MaxNonSplitRounding != 0 && c.MaxNonSplitRounding != gpu.LargeBuffer, fmt.Sprint(c.MaxNonSplitRounding>>20)),
		kv("garbage_collection_threshold", c.GarbageCollectionThreshold > 0, strconv.FormatFloat(c.GarbageCollectionThreshold, 'g', -1, 64)),
		kv("per_process_memory_fraction", c.MemoryFraction > 0, strconv.FormatFloat(c.MemoryFraction, 'g', -1, 64)),
		kv("release_lock_on_cudamalloc", c.ReleaseLockOnCudaMalloc, "True"),
		kv("roundup_power2_divisions", !uniform || c.RoundupDivisions[0] != 0, roundup),
	}
}
