package compute_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"nimbus/internal/cloud"
	"nimbus/internal/testenv"
)

// BenchmarkServerCreate creates servers one POST at a time from 16 clients
// without networks (fake driver, no delay), much as
// `nimbus bench` does.
func BenchmarkServerCreate(b *testing.B) {
	c := testenv.StartCloud(b, "", func(cfg *cloud.Config) { cfg.FakeDelay = 0 })
	client := testenv.HTTPClient(b, c)
	admin := testenv.Token(b, c, cloud.AdminUser)
	var img, project string
	c.DB.QueryRow(context.Background(), "SELECT id FROM images WHERE name = 'Debian 12'").Scan(&img)
	c.DB.QueryRow(context.Background(), "SELECT id FROM projects WHERE name = 'admin'").Scan(&project)
	testenv.Do(b, client, "PUT", c.ComputeURL+"/os-quota-sets/"+project, admin, `{"quota_set":{"instances":-1,"cores":-1,"ram":-1}}`)
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	next := make(chan int)
	for w := 0; w < 16; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				body := fmt.Sprintf(`{"server":{"name":"b%d","imageRef":%q,"flavorRef":"2","networks":"none"}}`, i, img)
				resp, raw := testenv.Do(b, client, "POST", c.ComputeURL+"/servers", admin, body, "OpenStack-API-Version", "compute 2.96")
				if resp.StatusCode != 202 {
					b.Errorf("create: %d %s", resp.StatusCode, raw)
				}
			}
		}()
	}
	for i := 0; i < b.N; i++ {
		next <- i
	}
	close(next)
	wg.Wait()
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "accepted/s")
}
