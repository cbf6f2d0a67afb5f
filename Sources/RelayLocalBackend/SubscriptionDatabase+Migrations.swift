import GRDB

// The two databases' migrations: the backend file's (`migrator`) and the events file's (`eventsMigrator`).
// Each registered migration stays as it is once released; a change of schema is a new one.
extension SubscriptionDatabase {
    static var eventsMigrator: DatabaseMigrator {
        var migrator = DatabaseMigrator()
        migrator.registerMigration("e1: the events store and the delivery log") { db in
            try EventStore.createSchema(db)
            try EventStore.createAppIndex(db)
            try DeliveryLog.createSchema(db)
            try DeliveryLog.createHealthSchema(db)
        }
        migrator.registerMigration("e2: an event's attempts found through their endpoint") { db in
            try DeliveryLog.dropEventIndex(db)
        }
        migrator.registerMigration("e3: an event's attempts found through their ids") { db in
            try DeliveryLog.dropEndpointEventIndex(db)
        }
        migrator.registerMigration("e4: a notification's events found through their ids") { db in
            try EventStore.narrowNotificationIndex(db)
        }
        migrator.registerMigration("e5: an endpoint's failed attempts read with their events") { db in
            try DeliveryLog.coverEndpointOutcomeIndex(db)
        }
        return migrator
    }

    static var migrator: DatabaseMigrator {
        var migrator = DatabaseMigrator()
        migrator.registerMigration("v1: subscriptions and their users") { db in
            try db.execute(
                sql: """
                    CREATE TABLE subscription (
                        store TEXT NOT NULL,
                        original_transaction_id TEXT NOT NULL,
                        version INTEGER NOT NULL,
                        source_timestamp INTEGER NOT NULL,
                        state TEXT NOT NULL,
                        updated_at INTEGER NOT NULL,
                        PRIMARY KEY (store, original_transaction_id)
                    );
                    CREATE TABLE subscription_user (
                        app_user_id TEXT NOT NULL,
                        store TEXT NOT NULL,
                        original_transaction_id TEXT NOT NULL,
                        PRIMARY KEY (app_user_id, store, original_transaction_id)
                    );
                    CREATE INDEX subscription_user_by_subscription ON subscription_user (store, original_transaction_id);
                    """)
        }
        migrator.registerMigration("v2: the events store") { db in
            try EventStore.createSchema(db)
        }
        migrator.registerMigration("v3: an app's events in recorded order") { db in
            try EventStore.createAppIndex(db)
        }
        migrator.registerMigration("v4: user aliases") { db in
            try createAliasSchema(db)
        }
        migrator.registerMigration("v5: user attributes") { db in
            try createAttributeSchema(db)
        }
        migrator.registerMigration("v6: promotional grants by their end") { db in
            try createGrantExpiryIndex(db)
        }
        migrator.registerMigration("v7: redemption codes") { db in
            try createRedemptionSchema(db)
        }
        migrator.registerMigration("v8: the delivery log") { db in
            try DeliveryLog.createSchema(db)
        }
        migrator.registerMigration(lastMigrationWithEvents) { db in
            try DeliveryLog.createHealthSchema(db)
        }
        // Only after `moveEvents` copied them (init): the events file holds them from here on.
        migrator.registerMigration(eventsMovedMigration) { db in
            for table in eventsTables { try db.execute(sql: "DROP TABLE IF EXISTS \(table)") }
            try db.execute(sql: "DELETE FROM sqlite_sequence WHERE name = 'event'")
        }
        return migrator
    }
}
