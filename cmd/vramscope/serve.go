package main

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"vramscope/gpu"
	"vramscope/live"
	"vramscope/server"
	"vramscope/server/guard"
	"vramscope/store"
)

func init() {
	register("serve", "serve the web UI and JSON API (the default command)", runServe)
}

func runServe(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("serve", stderr)
	addr := fs.String("addr", "127.0.0.1:8080", "listen address (loopback by default)")
	dbPath := dbFlag(fs, "")
	token := fs.String("token", os.Getenv("VRAMSCOPE_TOKEN"), "bearer token required of uploads, deletes and live ingest (default $VRAMSCOPE_TOKEN; made up when listening beyond loopback)")
	maxUpload := fs.String("max-upload", "2GiB", "largest snapshot upload accepted (larger ones get 413)")
	maxDecompressed := fs.String("max-decompressed", "", "largest snapshot once decompressed (default: --max-upload)")
	uploadTimeout := fs.Duration("upload-timeout", server.DefaultUploadTimeout, "time budget of decoding and storing one upload")
	var hosts hostList
	fs.Var(&hosts, "allowed-host", "a `NAME` this server answers to besides localhost and loopback addresses (repeatable; only matters on loopback)")
	maxMessage := fs.String("max-live-message", "8MiB", "largest live ingest message")
	maxStreams := fs.Int("max-live-streams", 64, "live ingest connections open at once")
	emptyExpiry := fs.Duration("live-empty-expiry", 10*time.Minute, "delete live traces that never got an event after this long")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: vramscope serve [--addr HOST:PORT] [--db FILE|postgres://...] [--token TOKEN] [--max-upload SIZE] [--allowed-host NAME]...")
		fs.PrintDefaults()
	}
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usagef("serve takes no arguments, got %q", pos)
	}
	limit, err := gpu.ParseBytes(*maxUpload)
	if err != nil {
		return usagef("--max-upload: %v", err)
	}
	decompressed := limit
	if *maxDecompressed != "" {
		if decompressed, err = gpu.ParseBytes(*maxDecompressed); err != nil {
			return usagef("--max-decompressed: %v", err)
		}
	}
	message, err := gpu.ParseBytes(*maxMessage)
	if err != nil {
		return usagef("--max-live-message: %v", err)
	}
	if *token == "" && !guard.Loopback(*addr) {
		// Beyond loopback anyone could write: make up a token and say it.
		*token = rand.Text()
		fmt.Fprintf(stderr, "vramscope: listening beyond loopback, so uploads and live ingest need a token: %s\n(choose one with --token or VRAMSCOPE_TOKEN)\n", *token)
	}
	// The address first: a port in use is said at once, not after the
	// demo traces are made.
	ln, err := net.Listen("tcp", *addr)
	if errors.Is(err, syscall.EADDRINUSE) {
		return fmt.Errorf("%s is already in use (another vramscope serve, or another program): stop it, or serve on another port with --addr 127.0.0.1:8081", *addr)
	}
	if err != nil {
		return fmt.Errorf("--addr %s: %w", *addr, err)
	}
	defer ln.Close()
	db, err := openDB(*dbPath)
	if err != nil {
		return err
	}
	defer db.Close()
	ts, err := db.Traces()
	if err != nil {
		return err
	}
	// A team's database starts empty: demo traces would be every
	// member's clutter.
	if len(ts) == 0 && !store.IsPostgres(*dbPath) {
		fmt.Fprintln(stderr, "vramscope: empty database, creating demo traces")
		if err := seedDemo(db); err != nil {
			return fmt.Errorf("demo traces: %w", err)
		}
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))
	srv := server.New(server.Options{DB: db, Addr: *addr, Token: *token, MaxUploadBytes: int64(limit),
		MaxDecompressedBytes: int64(decompressed), UploadTimeout: *uploadTimeout, AllowedHosts: hosts,
		Live: live.Options{MaxMessage: int64(message), MaxStreams: *maxStreams, EmptyExpiry: *emptyExpiry}, Logger: log})
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	return srv.Serve(ctx, ln, func(a net.Addr) {
		fmt.Fprintf(stdout, "vramscope: serving %s on http://%s/\n", *dbPath, a)
	})
}

// hostList is a repeatable flag.
type hostList []string

func (h *hostList) String() string { return strings.Join(*h, ",") }

func (h *hostList) Set(v string) error {
	if v == "" || strings.ContainsAny(v, "/ ") {
		return fmt.Errorf("%q is not a host name", v)
	}
	*h = append(*h, v)
	return nil
}
