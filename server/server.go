// Package server is vramscope's HTTP side: the pages, the JSON API they use,
// uploads and the embedded static files, behind one chi router.
package server

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"
	"github.com/go-chi/httprate"

	"vramscope/attrib"
	"vramscope/incident"
	"vramscope/live"
	"vramscope/server/guard"
	"vramscope/store"
)

// Options configure a server.
type Options struct {
	DB   *store.DB
	Addr string // listen address for ListenAndServe; 127.0.0.1:8080 when empty
	// Token, when set, is required of API writers (uploads, deletes) as
	// "Authorization: Bearer TOKEN"; readers need none on loopback.
	Token string
	// MaxUploadBytes caps a snapshot upload; DefaultMaxUpload when zero.
	MaxUploadBytes int64
	// MaxDecompressedBytes caps an upload once decompressed;
	// MaxUploadBytes when zero, so a gzip can cost no more than the
	// largest upload that is not compressed.
	MaxDecompressedBytes int64
	// UploadTimeout is the time budget of decoding and storing one
	// upload (DefaultUploadTimeout when zero).
	UploadTimeout time.Duration
	// AllowedHosts are Host names a server on loopback answers besides
	// loopback names and addresses.
	AllowedHosts []string
	// Timeouts for slow or idle clients.
	Timeouts guard.Timeouts
	// Live limits live ingest (message size, connections, expiry of
	// traces that never got an event).
	Live live.Options
	// Logger gets one line per request; slog.Default() when nil.
	Logger *slog.Logger
}

// DefaultMaxUpload is the upload cap when Options.MaxUploadBytes is zero.
const DefaultMaxUpload = 2 << 30

// DefaultUploadTimeout is Options.UploadTimeout when zero.
const DefaultUploadTimeout = 10 * time.Minute

// Permalinks a client may make per permalinkWindow.
const (
	permalinkRate   = 30
	permalinkWindow = time.Minute
)

// requestTimeout bounds every request but uploads and websockets.
const requestTimeout = 30 * time.Second

// Server serves one database.
type Server struct {
	opt    Options
	log    *slog.Logger
	router chi.Router
	// whatifs computes and keeps incident what-if tables (replays of a
	// whole trace), one replay at a time: replaySlots.
	whatifs     *incident.Jobs
	replaySlots chan struct{}
	whatifWait  time.Duration
	hub         *live.Hub // live ingest and viewers
	// cats keeps the categorizers (the regions) of the traces last shown.
	cats *attrib.Cache
	// predicts keeps the predictions asked for (predict.go).
	predicts predictions
}

// New builds the router. Routes are grouped so that long-lived ones
// (uploads and the live websockets) sit outside the timeout and
// compression middleware.
func New(opt Options) *Server {
	if opt.Addr == "" {
		opt.Addr = "127.0.0.1:8080"
	}
	if opt.MaxUploadBytes <= 0 {
		opt.MaxUploadBytes = DefaultMaxUpload
	}
	if opt.MaxDecompressedBytes <= 0 {
		opt.MaxDecompressedBytes = opt.MaxUploadBytes
	}
	if opt.UploadTimeout <= 0 {
		opt.UploadTimeout = DefaultUploadTimeout
	}
	opt.Timeouts.Defaults(requestTimeout + 30*time.Second)
	if opt.Logger == nil {
		opt.Logger = slog.Default()
	}
	s := &Server{opt: opt, log: opt.Logger, replaySlots: make(chan struct{}, 1), whatifWait: whatifWait}
	s.whatifs = incident.NewJobs(opt.DB, 16, s.replaySlots)
	s.cats = attrib.NewCache(8)
	r := chi.NewRouter()
	r.Use(guard.Deadlines(opt.Timeouts), middleware.RequestID, guard.Log(s.log), guard.Recover(s.log),
		guard.AllowHosts(opt.Addr, opt.AllowedHosts), guard.SecurityHeaders, guard.SameOrigin)

	r.Group(func(r chi.Router) {
		r.Use(middleware.Timeout(requestTimeout))
		r.Use(middleware.Compress(5, "text/html", "text/css", "text/plain", "text/javascript",
			"application/javascript", "application/json", "application/octet-stream"))
		r.Get("/", s.pageList)
		r.Get("/traces/{id}", s.pageTrace)
		r.Get("/traces/{id}/incidents/{n}", s.pageIncident)
		r.Get("/runs/{id}", s.pageRun)
		r.Get("/compare/{a}/{b}", s.pageCompare)
		r.Get("/api/compare/{a}/{b}", s.apiCompare)
		r.Get("/compare/{a}/{b}/predict", s.pagePredict)
		r.Get("/api/compare/{a}/{b}/predict", s.apiPredict)
		r.Route("/api/runs/{id}", func(r chi.Router) {
			r.Get("/", s.apiRun)
			r.With(guard.RequireToken(opt.Token)).Delete("/", s.apiDeleteRun)
			r.Get("/heatmap", s.apiRunHeatmap)
		})
		r.Get("/p/{token}", s.pagePermalink)
		r.With(guard.RequireToken(opt.Token), httprate.LimitBy(permalinkRate, permalinkWindow, clientIP,
			httprate.WithLimitHandler(func(w http.ResponseWriter, _ *http.Request) {
				writeError(w, http.StatusTooManyRequests, "more than %d permalinks a %s from this client: wait a little", permalinkRate, permalinkWindow)
			}))).Post("/api/permalinks", s.apiCreatePermalink)
		r.Get("/static/{version}/{name}", s.static)
		r.Get("/healthz", func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("ok\n")) })
		r.Route("/api/traces", func(r chi.Router) {
			r.Get("/", s.apiTraces)
			r.Route("/{id}", func(r chi.Router) {
				r.Get("/", s.apiTrace)
				r.With(guard.RequireToken(opt.Token)).Delete("/", s.apiDeleteTrace)
				r.With(guard.RequireToken(opt.Token)).Post("/complete", s.apiComplete)
				r.Get("/usage", s.apiUsage)
				r.Get("/seqtimes", s.apiSeqTimes)
				r.Get("/seqat", s.apiSeqAt)
				r.Get("/bands", s.apiBands)
				r.Get("/bands/categories", s.apiBandCategories)
				r.Get("/categories", s.apiCategoryAreas)
				r.Get("/live", s.apiLive)
				r.Get("/live.pb.gz", s.apiLiveProfile)
				r.Get("/steps", s.apiSteps)
				r.Get("/layout", s.apiLayout)
				r.Get("/summary", s.apiSummary)
				r.Get("/events", s.apiEvents)
				r.Get("/allocations", s.apiAllocations)
				r.Get("/allocations/{seq}", s.apiAllocation)
				r.Get("/stacks/{sid}", s.apiStack)
				r.Get("/search", s.apiSearch)
				r.Get("/extras", s.apiExtras)
				r.Get("/incidents", s.apiIncidents)
				r.Get("/incidents/{n}", s.apiIncident)
				r.Get("/incidents/{n}/whatif", s.apiWhatIf)
				r.Get("/whatif", s.apiTraceWhatIf)
			})
		})
	})
	// Uploads stream for as long as the file takes: no timeout, no compression.
	r.With(guard.RequireToken(opt.Token)).Post("/api/traces", s.apiUpload)
	s.mountLive(r)

	r.NotFound(s.notFound)
	r.MethodNotAllowed(func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusMethodNotAllowed, "method %s is not allowed on %s", r.Method, r.URL.Path)
	})
	s.router = r
	return s
}

// clientIP keys the permalink rate limit: the connection's peer address
// (vramscope serves clients directly; a header could be forged), IPv6 by
// its /64.
func clientIP(r *http.Request) (string, error) {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	return httprate.CanonicalizeIP(host), nil
}

// Handler returns the server's http.Handler.
func (s *Server) Handler() http.Handler { return s.router }

// adoptJobs finishes, until ctx ends, the what-if jobs whose server died
// (several servers on one database), one every incident.JobLease.
func (s *Server) adoptJobs(ctx context.Context) {
	tick := time.NewTicker(incident.JobLease)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			s.whatifs.Adopt()
		}
	}
}

// ListenAndServe serves on opt.Addr until ctx ends, then shuts down
// gracefully. ready, if not nil, is called with the bound address.
func (s *Server) ListenAndServe(ctx context.Context, ready func(addr net.Addr)) error {
	ln, err := net.Listen("tcp", s.opt.Addr)
	if err != nil {
		return err
	}
	return s.Serve(ctx, ln, ready)
}

// Serve is ListenAndServe on a listener already open, so that a caller
// can claim the address before slower work (opening the database).
func (s *Server) Serve(ctx context.Context, ln net.Listener, ready func(addr net.Addr)) error {
	// Bodies and answers have their deadlines set per request (deadlines),
	// so uploads and websockets can take the time they need.
	srv := &http.Server{Handler: s.router, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: s.opt.Timeouts.Idle,
		ErrorLog: slog.NewLogLogger(s.log.Handler(), slog.LevelWarn)}
	if ready != nil {
		ready(ln.Addr())
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	go s.adoptJobs(ctx)
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		err := srv.Shutdown(sctx)
		if s.hub != nil {
			s.hub.Close() // streams still open end as incomplete, resumable
		}
		if e := <-errc; !errors.Is(e, http.ErrServerClosed) {
			err = errors.Join(err, e)
		}
		return err
	}
}
