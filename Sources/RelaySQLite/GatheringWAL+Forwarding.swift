import GRDBSQLite

/// Every method forwarded to the default VFS's file (`Layout.real`).
func forwardingMethods() -> sqlite3_io_methods {
    sqlite3_io_methods(
        iVersion: 3,
        xClose: nil,
        xRead: { file, buffer, amount, offset in
            guard let file else { return SQLITE_MISUSE }
            let real = GatheringWAL.Layout.real(file)
            return real.pointee.pMethods.pointee.xRead!(real, buffer, amount, offset)
        },
        xWrite: { file, data, amount, offset in
            guard let file else { return SQLITE_MISUSE }
            let real = GatheringWAL.Layout.real(file)
            return real.pointee.pMethods.pointee.xWrite!(real, data, amount, offset)
        },
        xTruncate: { file, size in
            guard let file else { return SQLITE_MISUSE }
            let real = GatheringWAL.Layout.real(file)
            return real.pointee.pMethods.pointee.xTruncate!(real, size)
        },
        xSync: { file, flags in
            guard let file else { return SQLITE_MISUSE }
            let real = GatheringWAL.Layout.real(file)
            return real.pointee.pMethods.pointee.xSync!(real, flags)
        },
        xFileSize: { file, size in
            guard let file else { return SQLITE_MISUSE }
            let real = GatheringWAL.Layout.real(file)
            return real.pointee.pMethods.pointee.xFileSize!(real, size)
        },
        xLock: { file, level in
            guard let file else { return SQLITE_MISUSE }
            let real = GatheringWAL.Layout.real(file)
            return real.pointee.pMethods.pointee.xLock!(real, level)
        },
        xUnlock: { file, level in
            guard let file else { return SQLITE_MISUSE }
            let real = GatheringWAL.Layout.real(file)
            return real.pointee.pMethods.pointee.xUnlock!(real, level)
        },
        xCheckReservedLock: { file, result in
            guard let file else { return SQLITE_MISUSE }
            let real = GatheringWAL.Layout.real(file)
            return real.pointee.pMethods.pointee.xCheckReservedLock!(real, result)
        },
        xFileControl: { file, operation, argument in
            guard let file else { return SQLITE_MISUSE }
            let real = GatheringWAL.Layout.real(file)
            return real.pointee.pMethods.pointee.xFileControl!(real, operation, argument)
        },
        xSectorSize: { file in
            guard let file else { return 4096 }
            let real = GatheringWAL.Layout.real(file)
            return real.pointee.pMethods.pointee.xSectorSize!(real)
        },
        xDeviceCharacteristics: { file in
            guard let file else { return 0 }
            let real = GatheringWAL.Layout.real(file)
            return real.pointee.pMethods.pointee.xDeviceCharacteristics!(real)
        },
        xShmMap: { file, page, size, extend, pointer in
            guard let file else { return SQLITE_MISUSE }
            let real = GatheringWAL.Layout.real(file)
            return real.pointee.pMethods.pointee.xShmMap!(real, page, size, extend, pointer)
        },
        xShmLock: { file, offset, count, flags in
            guard let file else { return SQLITE_MISUSE }
            let real = GatheringWAL.Layout.real(file)
            return real.pointee.pMethods.pointee.xShmLock!(real, offset, count, flags)
        },
        xShmBarrier: { file in
            guard let file else { return }
            let real = GatheringWAL.Layout.real(file)
            real.pointee.pMethods.pointee.xShmBarrier!(real)
        },
        xShmUnmap: { file, delete in
            guard let file else { return SQLITE_MISUSE }
            let real = GatheringWAL.Layout.real(file)
            return real.pointee.pMethods.pointee.xShmUnmap!(real, delete)
        },
        xFetch: { file, offset, amount, pointer in
            guard let file else { return SQLITE_MISUSE }
            let real = GatheringWAL.Layout.real(file)
            return real.pointee.pMethods.pointee.xFetch!(real, offset, amount, pointer)
        },
        xUnfetch: { file, offset, pointer in
            guard let file else { return SQLITE_MISUSE }
            let real = GatheringWAL.Layout.real(file)
            return real.pointee.pMethods.pointee.xUnfetch!(real, offset, pointer)
        }
    )
}
