package store

import (
	"sync"
	"testing"
	"time"

	"vramscope/internal/pgtest"
)

// A job is taken by one of two handles asking at once, waited for by the
// other, taken over once its lease runs out, and its answer kept; a job
// whose runner died is found by TakeOrphanJob, by one handle of two.
func TestJobs(t *testing.T) { eachBackend(t, testJobs) }

func testJobs(t *testing.T) {
	a, path := openTemp(t)
	b, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	// Jobs of two handles of one process would share its owner on SQLite:
	// b stands for another process.
	b.owner = a.owner + 1_000_000

	for round := range 10 {
		key := "whatif/x/" + string(rune('a'+round))
		var wg sync.WaitGroup
		jobs := make([]Job, 2)
		for i, db := range []*DB{a, b} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var err error
				if jobs[i], err = db.TakeJob(key, "x", time.Minute); err != nil {
					t.Error(err)
				}
			}()
		}
		wg.Wait()
		if jobs[0].Mine == jobs[1].Mine || jobs[0].Done || jobs[1].Done {
			t.Fatalf("round %d: %+v", round, jobs)
		}
	}

	const key = "whatif/y/1"
	if j, err := a.TakeJob(key, "y", time.Minute); err != nil || !j.Mine || j.Takes != 1 {
		t.Fatalf("first take: %+v, %v", j, err)
	}
	if err := a.JobPartial(key, []byte("half")); err != nil {
		t.Fatal(err)
	}
	if j, err := b.TakeJob(key, "y", time.Minute); err != nil || j.Mine || string(j.Partial) != "half" {
		t.Fatalf("while a runs it: %+v, %v", j, err)
	}
	// a's lease runs out, as if it had died a minute ago.
	if _, err := a.w.Exec("UPDATE jobs SET lease_us = ? WHERE key = ?", time.Now().Add(-time.Second).UnixMicro(), key); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	found := make([]bool, 2)
	for i, db := range []*DB{a, b} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			j, ok, err := db.TakeOrphanJob(time.Minute)
			if err != nil {
				t.Error(err)
			}
			found[i] = ok && j.Key == key && j.Takes == 2
		}()
	}
	wg.Wait()
	if found[0] == found[1] {
		t.Fatalf("the orphan was taken by %v of the two", found)
	}
	owner, lost := b, a
	if found[0] {
		owner, lost = a, b
	}
	if err := lost.FinishJob(key, []byte("stale")); err == nil {
		t.Error("a handle that lost the job finished it")
	}
	if err := owner.RenewJob(key, time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := owner.FinishJob(key, []byte("whole")); err != nil {
		t.Fatal(err)
	}
	if j, err := lost.TakeJob(key, "y", time.Minute); err != nil || !j.Done || string(j.Result) != "whole" || j.Takes != 2 {
		t.Fatalf("done: %+v, %v", j, err)
	}
	// A failed job is dropped: the next to ask runs it.
	if j, _ := a.TakeJob("whatif/z/1", "z", time.Minute); !j.Mine {
		t.Fatal("a new job not taken")
	}
	if err := a.DropJob("whatif/z/1"); err != nil {
		t.Fatal(err)
	}
	if j, _ := b.TakeJob("whatif/z/1", "z", time.Minute); !j.Mine || j.Takes != 1 {
		t.Fatalf("a dropped job: %+v", j)
	}
}

// Servers sharing PostgreSQL judge job leases by the database's clock: a
// server whose own clock runs an hour ahead neither takes over a job
// whose lease has not run out nor gives its own a lease that has.
func TestJobLeasesOnTheDatabaseClock(t *testing.T) {
	addr := pgtest.Addr(t)
	a, err := Open(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := Open(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	defer func(c func() time.Time) { machineClock = c }(machineClock)
	machineClock = func() time.Time { return time.Now().Add(time.Hour) }

	if j, err := a.TakeJob("whatif/s/1", "s", time.Minute); err != nil || !j.Mine {
		t.Fatalf("first take: %+v, %v", j, err)
	}
	if j, err := b.TakeJob("whatif/s/1", "s", time.Minute); err != nil || j.Mine {
		t.Fatalf("a server an hour ahead took a running job: %+v, %v", j, err)
	}
	if j, ok, err := b.TakeOrphanJob(time.Minute); err != nil || ok {
		t.Fatalf("a server an hour ahead found an orphan: %+v, %v", j, err)
	}
	if err := a.RenewJob("whatif/s/1", time.Minute); err != nil {
		t.Fatal(err)
	}
	var lease int64
	if err := a.r.QueryRow("SELECT lease_us - CAST(extract(epoch from clock_timestamp()) * 1000000 AS bigint) FROM jobs").Scan(&lease); err != nil {
		t.Fatal(err)
	}
	if lease < 50e6 || lease > 60e6 {
		t.Fatalf("the lease runs out in %d µs by the database's clock, want about a minute", lease)
	}
}
