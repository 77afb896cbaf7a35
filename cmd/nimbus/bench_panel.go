package main

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"nimbus/internal/cloud"
	"nimbus/internal/driver"
	"nimbus/internal/driver/fake"
)

// benchPanel times the web panel's heaviest pages as a browser asks for
// them (HTTPS, a signed-in session, gzip): the servers list with servers
// in the account, a page of 100 and all 1,000 at once, and the
// configurator with its price, quota and live capacity; then the list
// under workers concurrent clients.
func benchPanel(dbURL string, servers, workers int, wait time.Duration) error {
	var fleet []driver.Host
	for i := range 40 {
		h := driver.Host{Name: fmt.Sprintf("panel-%03d", i), MemoryMB: 512 * 1024, DiskGB: 16000, Zone: "nova",
			Hypervisor: "fake", Up: true}
		fake.Topology(&h, 2, 40, 1)
		fleet = append(fleet, h)
	}
	c, b, stop, err := startBenchCloud("panel", dbURL, fleet, workers, wait)
	if err != nil {
		return err
	}
	defer stop()
	if err := b.createToActive(servers, 50, workers); err != nil {
		return err
	}
	hc := *b.http
	hc.Jar, _ = cookiejar.New(nil)
	hc.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	if err := panelLogin(&hc, c.PanelURL, cloud.AdminUser, c.Secrets.AdminPassword); err != nil {
		return err
	}
	for _, p := range []struct{ what, path string }{
		{"servers page (100 a page)", "/servers"},
		{fmt.Sprintf("servers page (all %d)", servers), "/servers?limit=1000"},
		{"configurator", "/configure?vcpus=4&ram_gb=8&disk_gb=80&ipv4=yes"},
	} {
		times := make([]time.Duration, 100)
		for i := range times {
			start := time.Now()
			if err := panelGet(&hc, c.PanelURL+p.path); err != nil {
				return err
			}
			times[i] = time.Since(start)
		}
		slices.Sort(times)
		fmt.Printf("%-40s%8.1f ms p50, %.1f ms p95 (%d servers in the account)\n", "panel: "+p.what+":",
			ms(times[len(times)/2]), ms(times[len(times)*95/100]), servers)
	}
	n, took, err := panelLoad(&hc, c.PanelURL+"/servers", workers, 5*time.Second)
	if err != nil {
		return err
	}
	fmt.Printf("%-40s%8.0f pages/s (%d clients, 100 servers a page)\n", "panel: servers page under load:", float64(n)/took.Seconds(), workers)
	return nil
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

var panelCSRF = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// panelLogin signs in through the login form, as a browser does.
func panelLogin(hc *http.Client, base, user, password string) error {
	resp, err := hc.Get(base + "/login")
	if err != nil {
		return err
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	m := panelCSRF.FindSubmatch(body)
	if m == nil {
		return errors.New("bench: no form token on the panel's login page")
	}
	resp, err = hc.PostForm(base+"/login", url.Values{"csrf": {string(m[1])}, "email": {user}, "password": {password}})
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusSeeOther || strings.HasPrefix(resp.Header.Get("Location"), "/login") {
		return fmt.Errorf("bench: panel sign-in: %d", resp.StatusCode)
	}
	return nil
}

// panelGet loads a page compressed, as a browser does, and reads it whole.
func panelGet(hc *http.Client, u string) error {
	req, _ := http.NewRequest(http.MethodGet, u, nil)
	req.Header.Set("Accept-Encoding", "gzip")
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("bench: GET %s: %d", u, resp.StatusCode)
	}
	return nil
}

// panelLoad loads u from workers clients for d and counts the pages.
func panelLoad(hc *http.Client, u string, workers int, d time.Duration) (int, time.Duration, error) {
	var mu sync.Mutex
	var n int
	var first error
	var wg sync.WaitGroup
	start := time.Now()
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Since(start) < d {
				if err := panelGet(hc, u); err != nil {
					mu.Lock()
					first = firstErr(first, err)
					mu.Unlock()
					return
				}
				mu.Lock()
				n++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return n, time.Since(start), first
}

func firstErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}
